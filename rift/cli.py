"""The `rift` command: the operator's door to the same engine. Its command line
(`parser`), `rift serve`, and `main`; what the other commands do is
`commands.py`."""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence

from rift.build_commands import add_image_parsers
from rift.commands import (
    cmd_doctor,
    cmd_host,
    cmd_image,
    cmd_pool,
    cmd_task,
    cmd_tasks,
    cmd_token,
    cmd_user,
    deps_of,
)
from rift.config import Settings
from rift.domain.errors import RiftError
from rift.services.context import Deps
from rift.volume_commands import add_parser as add_volume_parser


def served_url(host: str, port: int, tls: bool = False) -> str:
    """The URL `rift serve --host HOST --port PORT` is reached at from this machine
    (this machine's name when it listens on every address; https with TLS)."""
    from rift.api.rebinding import WILDCARDS

    if host in WILDCARDS:
        host = socket.getfqdn()
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from rift.api.guard import guarded_h11
    from rift.api.serving import serve
    from rift.app import create_app
    from rift.bootstrap import close_deps, ensure_admin

    if settings.public_url is None:  # exposures' URLs name the address served
        settings = settings.model_copy(update={"public_url": served_url(
            args.host, args.port, settings.tls_cert is not None)})
    deps = deps_of(settings)
    first = ensure_admin(deps)
    if first is not None:
        print("Created the user admin. Shown once, keep them now:", flush=True)
        print(f"  password: {first.password}", flush=True)
        print(f"  token:    {first.token}", flush=True)
    _default_pool(settings, deps)
    try:
        # The request head's deadline is the protocol's (RIFT_HEADER_TIMEOUT_S); the
        # body's is the app's (rift.api.guard).
        tls = (str(settings.tls_cert), str(settings.tls_key)) if settings.tls_cert else None
        serve(create_app(settings, deps, listen_host=args.host), host=args.host,
              port=args.port, http=guarded_h11(settings.header_timeout_s), tls=tls)
    finally:
        close_deps(deps)
    return 0


def _default_pool(settings: Settings, deps: Deps) -> None:
    """Make the pool RIFT_DEFAULT_POOL names, unless its image has one; say why not."""
    from rift.services.lifecycle import pools

    if not settings.default_pool:
        return
    image, running_text, saved_text = settings.default_pool.split(":")
    running, saved = int(running_text), int(saved_text)
    try:
        made = pools.ensure_default_pool(deps, image, running, saved)
    except RiftError as exc:
        print(f"RIFT_DEFAULT_POOL: no pool of {image}: {exc.message} ({exc.hint})",
              file=sys.stderr, flush=True)
        return
    if made is not None:
        print(f"Keeping a pool of {image}: {running} running, {saved} saved "
              "(RIFT_DEFAULT_POOL; rift pool set/clear changes it)", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rift", description="Rift: VMs lent to AI agents.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the control plane")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.set_defaults(run=cmd_serve)

    u = sub.add_parser("user", help="users").add_subparsers(dest="action", required=True)
    ua = u.add_parser("add")
    ua.add_argument("name")
    ua.add_argument("--password-stdin", action="store_true")
    ul = u.add_parser("list")
    ul.add_argument("--json", action="store_true")
    for x in (ua, ul):
        x.set_defaults(run=cmd_user)

    t = sub.add_parser("token", help="API tokens").add_subparsers(dest="action", required=True)
    tn = t.add_parser("new")
    tn.add_argument("user")
    tn.add_argument("--label")
    tn.add_argument("--operator", action="store_true",
                    help="an operator's token: /metrics shows it every user's VMs and tasks")
    tl = t.add_parser("list")
    tl.add_argument("user")
    tl.add_argument("--json", action="store_true")
    tr = t.add_parser("revoke")
    tr.add_argument("token_id")
    for x in (tn, tl, tr):
        x.set_defaults(run=cmd_token)

    ts = sub.add_parser("tasks", help="list tasks (every user's)")
    ts.add_argument("--all", action="store_true", help="closed ones too")
    ts.add_argument("--json", action="store_true")
    ts.set_defaults(run=cmd_tasks)

    k = sub.add_parser("task", help="one task").add_subparsers(dest="action", required=True)
    for action in ("show", "close"):
        ka = k.add_parser(action)
        ka.add_argument("id")
        ka.set_defaults(run=cmd_task)

    h = sub.add_parser("host", help="hypervisor hosts").add_subparsers(dest="action",
                                                                        required=True)
    ha = h.add_parser("add")
    ha.add_argument("name")
    ha.add_argument("uri")
    ha.add_argument("--vcpus", type=int)
    ha.add_argument("--memory-mib", type=int)
    hl = h.add_parser("list")
    hl.add_argument("--json", action="store_true")
    hd = h.add_parser("drain")
    hd.add_argument("name")
    hd.add_argument("--move", action="store_true",
                    help="also live-migrate its running VMs to other hosts")
    hu = h.add_parser("undrain", help="take new VMs again")
    hu.add_argument("name")
    hr = h.add_parser("remove")
    hr.add_argument("name")
    for x in (ha, hl, hd, hu, hr):
        x.set_defaults(run=cmd_host)

    i = sub.add_parser("image", help="guest images").add_subparsers(dest="action", required=True)
    ib = i.add_parser("build", help="build tiny or debian from Debian packages, or NAME "
                      "from a recipe (--recipe)")
    ib.add_argument("name")
    il = i.add_parser("list")
    il.add_argument("--json", action="store_true")
    iadd = i.add_parser("add", help="register a qcow2 image (cloud-init NoCloud, root by key, "
                        "SSH on 22), or make one from a snapshot (--snapshot)")
    iadd.add_argument("name")
    iadd.add_argument("path", nargs="?", help="the qcow2 file; it is copied")
    iadd.add_argument("--snapshot", metavar="SNAP_ID",
                      help="a snapshot (rift_vm_snapshot) whose state every VM of the "
                      "image starts from")
    irm = i.add_parser("remove", help="delete an image no live VM uses")
    irm.add_argument("name")
    for x in (ib, il, iadd, irm):
        x.set_defaults(run=cmd_image)
    add_image_parsers(i, ib)

    pl = sub.add_parser("pool", help="pools of ready VMs").add_subparsers(dest="action",
                                                                         required=True)
    ps = pl.add_parser("set", help="keep VMs of an image ready: --running booted, --saved "
                       "booted and saved to disk")
    ps.add_argument("image")
    ps.add_argument("--running", type=int, help="VMs kept running (default: as before, or 0)")
    ps.add_argument("--saved", type=int, help="VMs kept saved (default: as before, or 0)")
    ps.add_argument("--vcpus", type=int)
    ps.add_argument("--memory-mib", type=int)
    ps.add_argument("--host", help="only on this host (default: any host)")
    pls = pl.add_parser("list")
    pls.add_argument("--json", action="store_true")
    pc = pl.add_parser("clear", help="remove the pools of an image and destroy their VMs")
    pc.add_argument("image")
    for x in (ps, pls, pc):
        x.set_defaults(run=cmd_pool)

    add_volume_parser(sub)

    d = sub.add_parser("doctor", help="what works here and what to do about what does not")
    d.set_defaults(run=cmd_doctor)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = Settings()
    try:
        code: int = args.run(settings, args)
    except RiftError as exc:
        print(f"{exc.code}: {exc.message}\nhint: {exc.hint}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
