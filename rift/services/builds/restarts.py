"""Builds a restart cut (SPEC §19: a background job that a restart resumes or fails
cleanly). A build's row names the process that runs it (`builder.runner`); at
`rift serve`'s start, `fail_cut` fails each build left `running` by a process of
this machine that is gone: its row `failed` (`cut by a restart of rift serve`),
its task (named after it) records `build_cut` and closes, the last state it was
saving and the context a door unpacked for it (`build-contexts/<build id>`) go,
and so do the layers it left half-written or saved without their row
(the layers' sweep, when no other build holds the lock; else that build's own
sweep removes them). The layers it saved whole stay, the next build's cache. A cut
build is not resumed: its steps' guest state went with its VM."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from pathlib import Path

from rift.contract.operator import TaskIdIn
from rift.domain.model import NewEvent
from rift.services.builds import layers as kept_layers
from rift.services.builds.builder import BUILD_LOCK, lock_folder
from rift.services.builds.guest import last_folder
from rift.services.context import Deps
from rift.services.lifecycle.tasks import close_as_operator
from rift.services.operator.images import FolderLayers
from rift.services.ports.builds import LayerFiles


def _gone(where: str) -> bool:
    """Whether the process that ran a build on this machine is gone (a build of
    another machine, another replica's, is that machine's to settle)."""
    machine, _, pid = where.rpartition("/")
    if machine != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False  # it runs (or its id went to another process: left, to be safe)


def fail_cut(deps: Deps, files: LayerFiles | None = None, *,
             contexts: Path | None = None) -> list[str]:
    """At `rift serve`'s start: builds left `running` by a process of this machine
    that is gone were cut by a restart; each fails, its task (named after it) records
    `build_cut` and closes, and the layers it left half-written or without their row
    go (when no other build holds the lock; else that build's sweep removes them)."""
    now = deps.clock.now()
    why = "cut by a restart of rift serve; build again"
    with deps.store.write() as tx:
        cut = [b for b in tx.builds.running() if _gone(b.host)]
        open_tasks = [(t.id, b) for b in cut for t in tx.tasks.page(b.owner, "open", 500, None)
                      if t.name == b.id]
        for build in cut:
            tx.builds.save(build.failed(why, now), build)
        for task_id, build in open_tasks:
            tx.events.add(NewEvent(task_id, "build_cut", now, "sweep", {
                "build_id": build.id, "image": build.image, "error": why}))
    for build in cut:
        deps.log.warning("build cut by a restart", extra={"build_id": build.id})
    for task_id, _ in open_tasks:
        close_as_operator(deps, TaskIdIn(task_id=task_id, by="sweep"))
    for build in cut:  # a last state saved when the restart came, and its context
        folder = last_folder(deps, build.id)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if contexts is not None:
            shutil.rmtree(contexts / build.id, ignore_errors=True)
    if cut:
        _sweep_if_free(deps, files)
    return [b.id for b in cut]


def _sweep_if_free(deps: Deps, files: LayerFiles | None) -> None:
    """The layers' sweep, unless a build (of this process or another) holds the lock."""
    folder = lock_folder(deps)
    if files is None and folder is None:
        return
    if not BUILD_LOCK.acquire(blocking=False):
        return
    try:
        if folder is None:
            assert files is not None
            kept_layers.sweep(deps, files)
            return
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ".build.lock").open("a") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            kept_layers.sweep(deps, files or FolderLayers(folder))
    finally:
        BUILD_LOCK.release()
