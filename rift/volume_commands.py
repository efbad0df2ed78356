"""`rift volume …`: a user's volumes (SPEC §18) from the operator's command line,
through the same use cases as the MCP tools and REST (`--user` names whose)."""

from __future__ import annotations

import argparse
import json

from rift.commands import _print, deps_of, operator_label
from rift.config import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = sub.add_parser("volume", help="a user's volumes").add_subparsers(dest="action",
                                                                          required=True)
    parsers = [v.add_parser("list"), v.add_parser("get"), v.add_parser("new"),
               v.add_parser("delete"), v.add_parser("resize"), v.add_parser("clone")]
    for x in parsers:
        x.add_argument("--user", required=True, help="whose volumes")
        x.add_argument("--json", action="store_true")
        x.set_defaults(run=cmd_volume)
    for x in parsers[1:]:
        x.add_argument("target", help="the volume id (vol_…), or the new volume's name")
    parsers[2].add_argument("--size-gib", type=int, required=True)
    parsers[4].add_argument("--size-gib", type=int, required=True)
    parsers[5].add_argument("--name", required=True, help="the clone's name")
    parsers[5].add_argument("--snapshot", help="a snapshot (snap_…) of a VM that held the "
                            "volume: clone it as it was then")


def cmd_volume(settings: Settings, args: argparse.Namespace) -> int:
    from rift.contract import tools as c
    from rift.contract.base import command
    from rift.services.context import Caller
    from rift.services.lifecycle import volumes

    deps = deps_of(settings)
    caller = Caller(args.user, operator_label())
    if args.action == "list":
        rows = [v.model_dump(mode="json")
                for v in volumes.list_volumes(deps, caller, command(c.VolumeListIn)).volumes]
    else:
        calls = {
            "get": lambda: volumes.get(deps, caller, command(c.VolumeIdIn,
                                                             volume_id=args.target)),
            "new": lambda: volumes.new(deps, caller, command(
                c.VolumeNewIn, name=args.target, size_gib=args.size_gib)),
            "delete": lambda: volumes.delete(deps, caller, command(
                c.VolumeIdIn, volume_id=args.target)),
            "resize": lambda: volumes.resize(deps, caller, command(
                c.VolumeResizeIn, volume_id=args.target, size_gib=args.size_gib)),
            "clone": lambda: volumes.clone(deps, caller, command(
                c.VolumeCloneIn, volume_id=args.target, name=args.name,
                snapshot_id=args.snapshot)),
        }
        rows = [calls[args.action]().volume.model_dump(mode="json")]
    if args.json:
        print(json.dumps(rows if args.action == "list" else rows[0], indent=2))
        return 0
    for r in rows:
        r["attached_to"] = ", ".join(a["vm_id"] for a in r["attached_to"]) or "-"
    _print(rows, ("id", "name", "size_gib", "host", "attached_to"), False)
    return 0
