"""Builds whose guests install Debian packages from local files (SPEC §19), where
guests reach no mirror: the host's apt fetches the packages and what they need
beyond `debian` (hypervisor.debs, cached machine-wide in the images' cache), and
the build's context is the operator's folder with them as `debs/`, which the
recipe copies in and installs (`apt-get install /tmp/debs/*.deb`).

The operator's folder is held to RIFT_BUILD_CONTEXT_MIB as every door's context
is; the fetched .debs are not counted (Rift fetched them itself, from the host's
own package registry: 38 MiB for nodejs and npm, 121 MiB for the `python`
image's data stack), so the build's limit is the setting plus their size.

`rift image build python` is such a build of hypervisor/python.Recipe, under the
built-in name (no recipe of a user may take it), published at once.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.debs import base_status, cache_of, context_with, fetch, size
from rift.contract.base import command
from rift.contract.builds import BuildOut, ImageBuildIn, ImagePublishIn
from rift.domain.errors import InvalidArgument
from rift.services.builds import builder
from rift.services.builds.builder import BuildParts
from rift.services.builds.context import MIB, Context
from rift.services.context import Caller, Deps

PYTHON = "python"


def with_debs(images_dir: Path, packages: Iterable[str], folder: Path | None, into: Path,
              limit_mib: int) -> tuple[Context, int]:
    """(the context: `folder`'s files and `debs/` at `into`, the build's limit in MiB);
    invalid_argument when `folder` is over `limit_mib` or the packages cannot be had."""
    Context(folder).check_size(limit_mib)
    try:
        debs = fetch(packages, base_status(images_dir), cache_of(images_dir))
        context_with(folder, debs, into)
    except ImageError as exc:
        raise InvalidArgument("debs", str(exc)) from exc
    return Context(into), limit_mib + -(-size(debs) // MIB)


def build(deps: Deps, caller: Caller, cmd: ImageBuildIn, parts: BuildParts,
          packages: Iterable[str]) -> BuildOut:
    """A build (in this thread) whose context is `parts.context`'s folder with the .debs
    of `packages`; the context made for it is removed at its end."""
    images_dir = deps.runtime.images("name")
    work = Path(tempfile.mkdtemp(prefix=".debs-context-", dir=images_dir))
    try:
        context, limit = with_debs(images_dir, packages, parts.context.root, work / "context",
                                   parts.context_mib)
        return builder.submit(deps, caller, cmd, replace(
            parts, context=context, context_mib=limit, background=False))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_python(deps: Deps, caller: Caller, parts: BuildParts, *,
                 no_cache: bool = False) -> BuildOut:
    """`rift image build python`: hypervisor/python.Recipe with its packages as .debs,
    under the built-in name, published when it succeeds (`debian` must be there)."""
    from hypervisor.python_image import PACKAGES, RECIPE

    cmd = command(ImageBuildIn, name=PYTHON, recipe=RECIPE.read_text(), no_cache=no_cache)
    out = build(deps, caller, cmd, replace(parts, builtin=True, context=Context(None)),
                PACKAGES)
    if out.build.state == "succeeded":
        builder.publish(deps, caller, command(ImagePublishIn, name=PYTHON))
    return out
