"""What the operator's `rift` commands do (users, tokens, tasks, hosts, images,
pools, `doctor`), each calling the engine's use cases; their output a plain table
(`--json` for scripts). The command line itself, and `rift serve`, are `cli.py`."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Sequence
from typing import Any

from rift.config import Settings
from rift.services.context import Deps

OPERATOR_COLUMNS = ("id", "owner", "name", "status", "holder", "last_activity_at", "closes_at")


def deps_of(settings: Settings) -> Deps:
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


def cmd_user(settings: Settings, args: argparse.Namespace) -> int:
    from rift.services.access import accounts

    deps = deps_of(settings)
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

    deps = deps_of(settings)
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

    deps = deps_of(settings)
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

    deps = deps_of(settings)
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

    deps = deps_of(settings)
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
        for volume_id, to in report.volumes:
            print(f"moved volume {volume_id} (no VM holds it) to {to}")
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
        return _image_build(settings, args)
    if args.action == "add":
        return _image_add(settings, args)
    if args.action == "remove":
        from rift.services.operator.images import remove_image

        remove_image(deps_of(settings), args.name)
        print(f"removed image {args.name}")
        return 0
    rows = [{"name": n, "kind": images.kind(n), "built": "yes" if images.is_built(n) else "no"}
            for n in images.names() if not n.startswith("layer-")]  # a build's own
    _print(rows, ("name", "kind", "built"), args.json)
    return 0


def _image_build(settings: Settings, args: argparse.Namespace) -> int:
    """`rift image build tiny|debian` from Debian packages (`python` and NAME `--recipe
    FILE`: rift.build_commands)."""
    import time

    from hypervisor.base import ImageError
    from hypervisor.debian import build_debian
    from hypervisor.tiny import build_tiny

    builds = {"tiny": build_tiny, "debian": build_debian}
    if args.name not in builds:
        print(f"rift image build {args.name} takes --recipe FILE (only tiny, debian and "
              "python build without one)", file=sys.stderr)
        return 2
    started = time.monotonic()
    what = {"tiny": "kernel, busybox, dropbear",
            "debian": "kernel, a Debian 12 root by debootstrap, busybox"}[args.name]
    print(f"building {args.name} from Debian packages ({what})…", flush=True)
    build = builds[args.name]
    try:
        folder = build(settings.data_dir / "images")
    except ImageError as exc:
        print(f"image build failed: {exc}", file=sys.stderr)
        return 1
    print(f"built {args.name} in {folder} ({time.monotonic() - started:.1f} s)")
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

        folder = add_image_from_snapshot(deps_of(settings), command(
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

    deps = deps_of(settings)
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


def operator_label() -> str:
    return "cli:" + getpass.getuser()
