"""Images from a recipe (SPEC §19): the use cases every door calls (the CLI, REST,
and the engine itself, e.g. for the code contexts' `python` image).

`submit` checks the recipe before any VM starts (a line it cannot take, a FROM
that names no image the caller may start, a COPY source outside the context or
missing: `build_failed` naming the line; a name another user's image holds, a
built-in or an operator's image: `invalid_argument`), records the build
`running`, and runs it, in the background or in the caller's thread. Builds run
one at a time per control plane's images folder (a lock file there, so `rift
image build` and `rift serve` take turns). A build `rift serve` finds `running`
at its start was cut by a restart: rift.services.builds.restarts fails it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from rift.contract.builds import BuildGetIn, BuildOut, ImageBuildIn, ImageOut, ImagePublishIn
from rift.domain.builds import LAYER_PREFIX, Build, OwnedImage, new_build_id
from rift.domain.errors import BuildFailed, ImageNotFound, InvalidArgument, RiftError
from rift.domain.recipes import RecipeError, parse
from rift.services.builds import engine
from rift.services.builds import layers as kept_layers
from rift.services.builds.context import Context
from rift.services.builds.guest import VmBuildGuest
from rift.services.context import Caller, Deps
from rift.services.lifecycle.image_access import BuildCaller, sees, visible_names
from rift.services.operator.images import FolderLayers, check_unused
from rift.services.ports.builds import BuildGuest, LayerFiles
from rift.services.read import views

BUILTIN = ("tiny", "debian", "python")  # the images `rift image build` makes itself
BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class BuildParts:
    """What a build runs with besides the store: its guest and layers (fakes in unit
    tests), how long a CMD's ports may take (RIFT_BUILD_READY_S), and who hears its
    log lines as they come (the CLI's progress)."""

    context: Context = field(default_factory=lambda: Context(None))
    guest: Callable[[Caller, str], BuildGuest] | None = None
    layers: LayerFiles | None = None
    ready_s: float = 60.0
    progress: Callable[[str], None] | None = None
    background: bool = True
    remove_context: bool = False  # the context's folder is the build's own (REST's tar)
    context_mib: int = 10  # the largest context (RIFT_BUILD_CONTEXT_MIB)
    build_id: str | None = None  # the id the build takes (the E2B door answers it first)
    ready: str | None = None  # a CMD's ready check beyond its ports (E2B's readyCmd)
    builtin: bool = False  # Rift's own build of a built-in name (`rift image build python`)


def submit(deps: Deps, caller: Caller, cmd: ImageBuildIn, parts: BuildParts) -> BuildOut:
    """Check and record a build of `cmd.name`, then run it (at once in this thread,
    or in the background); answers the build (ended, when not in the background)."""
    layers = parts.layers or FolderLayers(deps.runtime.images("name"))
    parts = replace(parts, layers=layers)
    try:
        recipe = parse(cmd.recipe)
    except RecipeError as exc:
        raise BuildFailed(exc.why, exc.line) from exc
    parts.context.check_size(parts.context_mib)
    builder = BuildCaller(caller.user, f"build:{caller.label}", caller.operator)
    with deps.store.read() as tx:
        _check_name(deps, tx.owned_images.get(cmd.name), caller, cmd.name, parts.builtin)
        if recipe.base not in deps.images.names() or not sees(
                tx.owned_images.get(recipe.base), caller, recipe.base):
            raise BuildFailed(f"FROM {recipe.base} names no image of yours; the images "
                              f"there are: {', '.join(visible_names(deps, tx, caller))}",
                              recipe.base_line)
    check_unused(deps, cmd.name, "name", "building it again")  # its files are replaced
    the_plan = engine.make_plan(recipe, layers.identity(recipe.base), caller.user,
                                 parts.context, parts.ready if recipe.settings.cmd else None)
    build = Build(id=parts.build_id or new_build_id(), image=cmd.name, owner=caller.user,
                  host=runner(), state="running", recipe=cmd.recipe,
                  no_cache=cmd.no_cache, created_at=deps.clock.now(),
                  steps=len(the_plan.planned))
    with deps.store.write() as tx:
        if tx.builds.get(build.id) is not None:
            raise InvalidArgument("build_id", f"{build.id} is another build's; ask for a new one")
        tx.builds.add(build)

    def work() -> None:
        _execute(deps, builder, build, the_plan, parts)

    if parts.background:
        threading.Thread(target=work, name=f"build-{build.id}", daemon=True).start()
        return BuildOut(build=views.build(build))
    work()
    with deps.store.read() as tx:
        ended = tx.builds.get(build.id)
    assert ended is not None
    return BuildOut(build=views.build(ended))


def _check_name(deps: Deps, row: OwnedImage | None, caller: Caller, name: str,
                builtin: bool = False) -> None:
    if builtin != (name in BUILTIN) or name.startswith(LAYER_PREFIX):
        raise InvalidArgument("name", f"{name!r} is Rift's own; choose another name")
    if row is None and name in deps.images.names() and not builtin:
        raise InvalidArgument("name", f"{name!r} is an operator's image; choose another name")
    if row is not None and row.owner != caller.user:
        raise InvalidArgument("name", f"image {name!r} is another user's; choose another name")


class _Log:
    """A build's log: each line saved on its row as it comes, and told to the door."""

    def __init__(self, deps: Deps, build: Build, progress: Callable[[str], None] | None):
        self.deps, self.build, self.progress, self.cached = deps, build, progress, 0

    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)
        with self.deps.store.write() as tx:
            current = tx.builds.get(self.build.id)
            if current is not None and current.state == "running":
                tx.builds.save(current.logged(line + "\n", self.cached), current)


def _execute(deps: Deps, caller: Caller, build: Build, the_plan: engine.Plan,
             parts: BuildParts) -> None:
    log = _Log(deps, build, parts.progress)
    layers = parts.layers
    assert layers is not None
    guest = (parts.guest or (lambda c, b: VmBuildGuest(deps, c, b)))(caller, build.id)
    error: str | None = None
    try:
        with _one_at_a_time(deps, log):
            found = kept_layers.found(deps, layers, build.owner,
                                      [s.key for s in the_plan.stages])
            hits = engine.reused(the_plan, found, build.no_cache)
            log.cached = engine.steps_reused(the_plan, hits)
            kept_layers.mark_reused(deps, build.id,
                                    [found[s.key] for s in the_plan.stages[:hits]])
            job = engine.Job(guest, parts.context, parts.ready_s, log.say, layers, build.id,
                             keep=lambda name, key: _keep_layer(deps, caller, build, name, key),
                             found=found, ready=parts.ready)
            try:
                last = engine.run(the_plan, hits, job)
                check_unused(deps, build.image, "name", "building it again")  # again, now
                clock = time.monotonic()
                layers.image_from(last, build.image)
                _keep_image(deps, build)
                log.say(f"image {build.image} made in {time.monotonic() - clock:.1f} s")
            finally:
                clock = time.monotonic()
                guest.close()
                kept_layers.sweep(deps, layers)
                log.say(f"the VM closed and the layers swept in "
                        f"{time.monotonic() - clock:.1f} s")
    except RiftError as exc:
        error = exc.message
        if exc.details.get("output"):
            log.say(str(exc.details["output"]).rstrip("\n"))
    except Exception as exc:  # a bug or a host's failure: the build fails, saying so
        deps.log.exception("build failed", extra={"build_id": build.id})
        error = f"{type(exc).__name__}: {exc}"
    if parts.remove_context and parts.context.root is not None:
        shutil.rmtree(parts.context.root, ignore_errors=True)
    with deps.store.write() as tx:
        current = tx.builds.get(build.id)
        if current is not None and current.state == "running":
            now = deps.clock.now()
            ended = current.failed(error, now) if error else current.succeeded(now)
            tx.builds.save(ended, current)
    deps.log.info("build ended", extra={"build_id": build.id, "image": build.image,
                                        "error": error})


def _keep_layer(deps: Deps, caller: Caller, build: Build, name: str, key: str) -> None:
    """The row of a layer the build saved: its owner's, started by their builds alone."""
    with deps.store.write() as tx:
        if tx.owned_images.get(name) is None:
            tx.owned_images.add(OwnedImage(name, caller.user, "layer", False, build.id, key,
                                           deps.clock.now()))


def _keep_image(deps: Deps, build: Build) -> None:
    with deps.store.write() as tx:
        row = tx.owned_images.get(build.image)
        made = OwnedImage(build.image, build.owner, "image", False, build.id, None,
                          deps.clock.now())
        if row is None:
            tx.owned_images.add(made)
        else:
            tx.owned_images.save(OwnedImage(row.name, row.owner, "image", row.published,
                                            build.id, None, row.created_at), row)


@contextmanager
def _one_at_a_time(deps: Deps, log: _Log) -> Iterator[None]:
    folder = lock_folder(deps)
    if not BUILD_LOCK.acquire(blocking=False):
        log.say("waiting for the build before it")
        BUILD_LOCK.acquire()
    try:
        if folder is None:
            yield
            return
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ".build.lock").open("a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            yield
    finally:
        BUILD_LOCK.release()


def lock_folder(deps: Deps) -> Path | None:
    try:
        return deps.runtime.images("name")
    except InvalidArgument:
        return None


# -- reading, publishing, restarts ---------------------------------------------------------

def get(deps: Deps, caller: Caller, cmd: BuildGetIn) -> BuildOut:
    with deps.store.read() as tx:
        build = tx.builds.get(cmd.build_id)
    if build is None or build.owner != caller.user:
        raise InvalidArgument("build_id", f"no build {cmd.build_id} of yours")
    return BuildOut(build=views.build(build, cmd.log_from))


def publish(deps: Deps, caller: Caller, cmd: ImagePublishIn) -> ImageOut:
    """`rift image publish NAME`: the caller's built image becomes everyone's."""
    with deps.store.write() as tx:
        row = tx.owned_images.get(cmd.name)
        if row is None or row.kind != "image" or not sees(row, caller) or (
                row.owner != caller.user and not caller.operator):
            raise ImageNotFound(cmd.name, visible_names(deps, tx, caller))
        tx.owned_images.save(row.publish(), row)
        return ImageOut(image=views.image(row.publish()))


def runner() -> str:
    """Where a build runs: this machine and process (a build's `host` column)."""
    return f"{socket.gethostname()}/{os.getpid()}"
