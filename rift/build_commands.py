"""`rift image build NAME --recipe FILE [--context DIR] [--no-cache]`, `rift image
builds`, `rift image build-log BUILD_ID` and `rift image publish NAME`: images from
a recipe (SPEC §19) from the operator's command line, through the same use cases
as REST (`--user` names whose; default `admin`). A build runs in this process and
prints each step as it goes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rift.commands import _print, cmd_image, deps_of, operator_label
from rift.config import Settings

BUILD_COLUMNS = ("build_id", "image", "state", "steps", "cached", "created_at", "error")


def add_image_parsers(i: argparse._SubParsersAction[argparse.ArgumentParser],
                      build: argparse.ArgumentParser) -> None:
    """The recipe's options on `rift image build`, and the builds' own commands."""
    build.add_argument("--recipe", metavar="FILE", help="build NAME from this recipe (a "
                       "Dockerfile subset: FROM, RUN, COPY, ENV, WORKDIR, USER, ARG, EXPOSE, CMD)")
    build.add_argument("--context", metavar="DIR", help="the folder COPY reads from")
    build.add_argument("--debs", metavar="PACKAGES", default="", help="Debian packages the "
                       "host's apt fetches, with what they need beyond debian, into debs/ of "
                       "the context (for the recipe to COPY and install offline)")
    build.add_argument("--no-cache", action="store_true", help="reuse no layer")
    build.add_argument("--user", default="admin", help="whose image it is (default admin)")
    builds = i.add_parser("builds", help="a user's image builds, newest first")
    builds.add_argument("--user", default="admin")
    builds.add_argument("--json", action="store_true")
    log = i.add_parser("build-log", help="one build's record and its whole log")
    log.add_argument("build_id")
    log.add_argument("--user", default="admin")
    publish = i.add_parser("publish", help="let every user start a built image")
    publish.add_argument("name")
    publish.add_argument("--user", default="admin")
    for x in (builds, log, publish):
        x.set_defaults(run=cmd_builds)
    build.set_defaults(run=cmd_image_build)


def cmd_image_build(settings: Settings, args: argparse.Namespace) -> int:
    """`rift image build NAME`: from a recipe with `--recipe` (and `python`, from its
    own), else one of the images built from Debian packages (rift.commands)."""
    if args.recipe or args.name == "python":
        return cmd_build(settings, args)
    return cmd_image(settings, args)


def cmd_build(settings: Settings, args: argparse.Namespace) -> int:
    from rift.contract.base import command
    from rift.contract.builds import ImageBuildIn
    from rift.services.builds import builder, offline
    from rift.services.builds.builder import BuildParts
    from rift.services.builds.context import Context
    from rift.services.context import Caller

    folder = Path(args.context) if args.context else None
    deps = deps_of(settings)
    caller = Caller(args.user, operator_label())
    parts = BuildParts(context=Context(folder), ready_s=settings.build_ready_s,
                       context_mib=settings.build_context_mib,
                       progress=lambda line: print(line, flush=True), background=False)
    if not args.recipe:  # python: its recipe FROM debian (built first when missing)
        if not (settings.data_dir / "images" / "debian").is_dir() and cmd_image(
                settings, argparse.Namespace(**{**vars(args), "name": "debian"})):
            return 1
        out = offline.build_python(deps, caller, parts, no_cache=args.no_cache).build
    else:
        cmd = command(ImageBuildIn, name=args.name, recipe=Path(args.recipe).read_text(),
                      no_cache=args.no_cache)
        out = (offline.build(deps, caller, cmd, parts, args.debs.split())
               if args.debs.split() else builder.submit(deps, caller, cmd, parts)).build
    if out.state != "succeeded":
        print(f"build_failed: {out.error}\nhint: rift image build-log {out.build_id} shows "
              "the whole log; mend the recipe and build again", file=sys.stderr)
        return 1
    print(f"built {args.name} ({out.build_id}: {out.steps} steps, {out.cached} reused); "
          f"rift_vm_new with image={args.name} starts it (yours until rift image publish)")
    return 0


def cmd_builds(settings: Settings, args: argparse.Namespace) -> int:
    from rift.contract.base import command
    from rift.contract.builds import BuildGetIn, ImagePublishIn
    from rift.services.builds import builder
    from rift.services.context import Caller
    from rift.services.read import views

    deps = deps_of(settings)
    caller = Caller(args.user, operator_label())
    if args.action == "publish":
        image = builder.publish(deps, caller, command(ImagePublishIn, name=args.name)).image
        print(f"published {image.name}: every user's rift_vm_new may start it")
        return 0
    if args.action == "build-log":
        got = builder.get(deps, caller, command(BuildGetIn, build_id=args.build_id)).build
        print(f"{got.build_id} {got.image} {got.state} ({got.steps} steps, {got.cached} "
              f"reused){': ' + got.error if got.error else ''}")
        print(got.log, end="")
        return 0
    with deps.store.read() as tx:
        rows = [views.build(b).model_dump(mode="json", exclude={"log", "log_offset"})
                for b in tx.builds.of_owner(args.user)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print(rows, BUILD_COLUMNS, False)
    return 0
