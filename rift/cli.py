"""The `rift` command: the operator's door to the same engine."""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
from collections.abc import Sequence
from typing import Any

from rift.config import Settings
from rift.domain.errors import RiftError
from rift.services.context import Deps

OPERATOR_COLUMNS = ("id", "owner", "name", "status", "holder", "last_activity_at", "closes_at")


def _deps(settings: Settings) -> Deps:
    from rift.bootstrap import build_deps

    return build_deps(settings)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain, aligned table: what people read; `--json` is for scripts."""
    cells = [[("-" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _print(rows: list[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    print(json.dumps(rows, indent=2) if as_json else table(rows, columns))


def served_url(host: str, port: int) -> str:
    """The URL `rift serve --host HOST --port PORT` is reached at from this machine
    (this machine's name when it listens on every address)."""
    from rift.api.rebinding import WILDCARDS

    if host in WILDCARDS:
        host = socket.getfqdn()
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from rift.api.app import create_app
    from rift.api.guard import guarded_h11
    from rift.api.serving import serve
    from rift.bootstrap import close_deps, ensure_admin

    if settings.public_url is None:  # exposures' URLs name the address served
        settings = settings.model_copy(update={"public_url": served_url(args.host, args.port)})
    deps = _deps(settings)
    first = ensure_admin(deps)
    if first is not None:
        print("Created the user admin. Shown once, keep them now:", flush=True)
        print(f"  password: {first.password}", flush=True)
        print(f"  token:    {first.token}", flush=True)
    _default_pool(settings, deps)
    try:
        # The request head's deadline is the protocol's (RIFT_HEADER_TIMEOUT_S); the
        # body's is the app's (rift.api.guard).
        serve(create_app(settings, deps, listen_host=args.host), host=args.host,
              port=args.port, http=guarded_h11(settings.header_timeout_s))
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


def cmd_user(settings: Settings, args: argparse.Namespace) -> int:
    from rift.services.access import accounts

    deps = _deps(settings)
    if args.action == "add":
        password = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
        user = accounts.add_user(deps, args.name, password)
        print(f"added user {user.name}")
        return 0
    rows = [{"name": u.name, "password": "set" if u.password_hash else "-",
             "created_at": u.created_at.isoformat()} for u in accounts.list_users(deps)]
    _print(rows, ("name", "password", "created_at"), args.json)
    return 0


def cmd_token(settings: Settings, args: argparse.Namespace) -> int:
    from rift.services.access import accounts

    deps = _deps(settings)
    if args.action == "new":
        made = accounts.new_token(deps, args.user, args.label, operator=args.operator)
        print(made.token.value)
        return 0
    if args.action == "revoke":
        if not accounts.revoke_token(deps, args.token_id):
            print(f"no live token {args.token_id}; rift token list USER shows them",
                  file=sys.stderr)
            return 1
        print(f"revoked {args.token_id}")
        return 0
    rows = [{"id": t.id, "label": t.label, "operator": t.operator,
             "created_at": t.created_at.isoformat(),
             "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None}
            for t in accounts.list_tokens(deps, args.user)]
    _print(rows, ("id", "label", "operator", "created_at", "revoked_at"), args.json)
    return 0


def cmd_tasks(settings: Settings, args: argparse.Namespace) -> int:
    from rift.contract.base import command
    from rift.contract.tasks import TaskListIn
    from rift.services.lifecycle import tasks

    deps = _deps(settings)
    rows: list[dict[str, Any]] = []
    after = None
    while True:
        page = tasks.list_tasks(deps, None, command(
            TaskListIn, status="all" if args.all else "open", limit=100, after=after))
        rows += [t.model_dump(mode="json") for t in page.tasks]
        after = page.next_after
        if after is None:
            break
    if not args.json:
        for r in rows:
            r["vms"] = len(r["vms"])
    _print(rows, (*OPERATOR_COLUMNS, "vms"), args.json)
    return 0


def cmd_task(settings: Settings, args: argparse.Namespace) -> int:
    from rift.contract.base import command
    from rift.contract.operator import TaskIdIn
    from rift.services.lifecycle import tasks

    deps = _deps(settings)
    if args.action == "close":
        result = tasks.close_as_operator(deps, command(TaskIdIn, task_id=args.id,
                                                       by=operator_label()))
        print(f"closed {args.id}; destroyed {len(result.destroyed)} VMs")
        return 0
    view = tasks.operator_view(deps, command(TaskIdIn, task_id=args.id))
    print(json.dumps(view.model_dump(mode="json"), indent=2))
    return 0


def cmd_host(settings: Settings, args: argparse.Namespace) -> int:
    from rift.services.operator import hosts

    deps = _deps(settings)
    if args.action == "add":
        host = hosts.add_host(deps, args.name, args.uri,
                              hosts.HostSize(args.vcpus, args.memory_mib))
        print(f"added host {host.name} ({host.vcpus} vCPUs, {host.memory_mib} MiB)")
    elif args.action == "drain" and args.move:
        from rift.services.operator.moves import drain_and_move

        report = drain_and_move(deps, args.name)
        for vm_id, to in report.moved:
            print(f"moved {vm_id} to {to}")
        for vm_id, why in report.stayed:
            print(f"left {vm_id} on {args.name}: {why}")
        for vm_id, why in report.failed:
            print(f"could not move {vm_id} (it runs on {args.name} as before): {why}",
                  file=sys.stderr)
        print(f"drained {args.name}: it takes no new VMs; {len(report.moved)} moved, "
              f"{len(report.failed)} not")
        return 1 if report.failed else 0
    elif args.action == "drain":
        hosts.drain_host(deps, args.name)
        print(f"drained {args.name}: it takes no new VMs")
    elif args.action == "undrain":
        hosts.drain_host(deps, args.name, drained=False)
        print(f"{args.name} takes new VMs again")
    elif args.action == "remove":
        hosts.remove_host(deps, args.name)
        print(f"removed {args.name}")
    else:
        cols = ("name", "uri", "state", "vcpus", "used_vcpus", "memory_mib", "used_memory_mib",
                "vms", "paused", "pooled", "snapshots", "snapshot_mib")
        _print(hosts.list_hosts(deps), cols, args.json)
    return 0


def cmd_image(settings: Settings, args: argparse.Namespace) -> int:
    from rift.catalog import DirectoryImages

    images = DirectoryImages(settings.data_dir / "images")
    if args.action == "build":
        import time

        from hypervisor.base import ImageError
        from hypervisor.debian import build_debian
        from hypervisor.tiny import build_tiny

        started = time.monotonic()
        what = {"tiny": "kernel, busybox, dropbear",
                "debian": "kernel, a Debian 12 root by debootstrap, busybox"}[args.name]
        print(f"building {args.name} from Debian packages ({what})…", flush=True)
        build = build_debian if args.name == "debian" else build_tiny
        try:
            folder = build(settings.data_dir / "images")
        except ImageError as exc:
            print(f"image build failed: {exc}", file=sys.stderr)
            return 1
        print(f"built {args.name} in {folder} ({time.monotonic() - started:.1f} s)")
        return 0
    if args.action == "add":
        return _image_add(settings, args)
    if args.action == "remove":
        from rift.services.operator.images import remove_image

        remove_image(_deps(settings), args.name)
        print(f"removed image {args.name}")
        return 0
    rows = [{"name": n, "kind": images.kind(n), "built": "yes" if images.is_built(n) else "no"}
            for n in images.names()]
    _print(rows, ("name", "kind", "built"), args.json)
    return 0


def _image_add(settings: Settings, args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from hypervisor.base import ImageError
    from hypervisor.qcow2 import add_qcow2

    if (args.path is None) == (args.snapshot is None):
        print("image add takes a qcow2 file or --snapshot SNAP_ID (one of them)",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    if args.snapshot is not None:
        from rift.contract.base import command
        from rift.contract.operator import ImageFromSnapshotIn
        from rift.services.operator.images import add_image_from_snapshot

        folder = add_image_from_snapshot(_deps(settings), command(
            ImageFromSnapshotIn, name=args.name, snapshot_id=args.snapshot))
        what = f"from snapshot {args.snapshot}"
    else:
        try:
            folder = add_qcow2(settings.data_dir / "images", args.name, Path(args.path))
        except ImageError as exc:
            print(f"image add failed: {exc}", file=sys.stderr)
            return 1
        what = "(qcow2)"
    print(f"added {args.name} {what} in {folder} ({time.monotonic() - started:.1f} s); "
          f"rift_vm_new with image={args.name} starts it")
    return 0


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    from rift.doctor import run_doctor

    return run_doctor(settings)


POOL_COLUMNS = ("image", "host", "vcpus", "memory_mib", "running", "saved", "last_error")


def cmd_pool(settings: Settings, args: argparse.Namespace) -> int:
    from rift.contract.base import command
    from rift.contract.operator import PoolSetIn
    from rift.services.lifecycle import pools

    deps = _deps(settings)
    if args.action == "set":
        pool = pools.set_pool(deps, command(
            PoolSetIn, image=args.image, running=args.running, saved=args.saved,
            vcpus=args.vcpus, memory_mib=args.memory_mib, host=args.host))
        print(f"pool {pool.image} ({pool.vcpus} vCPU, {pool.memory_mib} MiB, "
              f"{pool.host or 'any host'}): {pool.running} running, {pool.saved} saved; "
              "rift serve fills it in the background")
    elif args.action == "clear":
        gone = pools.clear_pool(deps, args.image)
        print(f"cleared the pools of {args.image}: {gone} pooled VMs destroyed")
    else:
        rows = [row.as_dict() for row in pools.pool_rows(deps)]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(table([{**r, "running": f"{r['running']['ready']}/{r['running']['want']}",
                          "saved": f"{r['saved']['ready']}/{r['saved']['want']}"}
                         for r in rows], POOL_COLUMNS))
    return 0


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
    ib = i.add_parser("build")
    ib.add_argument("name", choices=["tiny", "debian"])
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

    d = sub.add_parser("doctor", help="what works here and what to do about what does not")
    d.set_defaults(run=cmd_doctor)
    return p


def operator_label() -> str:
    return "cli:" + getpass.getuser()


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
