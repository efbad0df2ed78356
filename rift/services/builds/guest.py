"""A build's VM (the BuildGuest port) over the engine's own use cases, as the
building user: a task of theirs named after the build holds it (so their quotas
and rates count it, and `rift tasks` shows it), `rift_vm_new` starts it from a
layer or the FROM image, `rift_vm_exec` runs each step, a snapshot turned into a
hidden image (`rift image add --snapshot`'s use case) is each layer.

Layers' and built images' files (the LayerFiles port) are snapshot images in the
images folder: rift.services.operator.images.FolderLayers.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rift.contract.base import MAX_WAIT_S
from rift.contract.execs import VmExecGetIn, VmExecIn
from rift.contract.operator import ImageFromSnapshotIn
from rift.contract.snapshots import VmSnapshotDeleteIn, VmSnapshotIn
from rift.contract.tasks import TaskCloseIn, TaskNewIn
from rift.contract.vms import VmNewIn
from rift.domain.builds import LAYER_PREFIX
from rift.domain.errors import BuildFailed, RiftError
from rift.services.context import Caller, Deps
from rift.services.lifecycle import execs, snapshots, tasks, vms
from rift.services.operator.images import add_image_from_snapshot, layer_from_vm
from rift.services.ports import PortClosed

KEEP_OUTPUT = 64 * 1024
# A fork's SSH server starts anew with its new host key this long after the fork
# (rift.guest.scripts.SETTLE_S, and the restart itself): a state saved before then
# carries the restart to come, and every VM of an image made from it would wait for
# it at its first login (3.5 s instead of 0.8 s for `tiny`). Only a build VM forked
# from an image (FROM a built image) waits: one of a layer keeps the layer's host key.
FORK_SETTLE_S = 3.0


def last_folder(deps: Deps, build_id: str) -> Path | None:
    """Where a build's last state is saved before it becomes its layer: a hidden
    folder in the images folder (the sweep removes folders of `snapshots/` that no
    snapshot row names); None without real guests."""
    try:
        return deps.runtime.images("name") / f".last-{build_id}"
    except RiftError:
        return None


class VmBuildGuest:
    def __init__(self, deps: Deps, caller: Caller, build_id: str) -> None:
        self.deps, self.caller, self.build_id = deps, caller, build_id
        self.handle: str | None = None
        self.vm_id: str | None = None
        self.forked_at: float | None = None  # when its VM started as a fork of a layer

    def _held(self) -> tuple[str, str]:
        assert self.handle is not None and self.vm_id is not None, "no VM started"
        return self.handle, self.vm_id

    def start(self, image: str) -> None:
        if self.handle is None:
            opened = tasks.new(self.deps, self.caller, TaskNewIn(name=self.build_id))
            self.handle = opened.handle
        made = vms.new(self.deps, self.caller, VmNewIn(handle=self.handle, image=image))
        if made.vm.status != "running":
            raise BuildFailed(f"the build's VM of {image} did not start: {made.vm.error}")
        self.vm_id = made.vm.id
        # A VM of a layer keeps its layer's host key (SnapshotGuest): no restart to wait for.
        forked = made.vm.start is not None and made.vm.start.kind == "fork"
        self.forked_at = time.monotonic() if forked and not image.startswith(LAYER_PREFIX) \
            else None

    def run(self, script: str, timeout_s: int) -> tuple[int | None, str]:
        handle, vm_id = self._held()
        view = execs.start(self.deps, self.caller, VmExecIn(
            handle=handle, vm_id=vm_id, command=script, timeout_s=timeout_s,
            wait_s=min(timeout_s, MAX_WAIT_S)))
        output = view.stdout + view.stderr
        while view.status == "running":
            view = execs.get(self.deps, self.caller, VmExecGetIn(
                handle=handle, exec_id=view.exec_id, stdout_offset=view.stdout_offset,
                stderr_offset=view.stderr_offset, wait_s=MAX_WAIT_S))
            output = (output + view.stdout + view.stderr)[-KEEP_OUTPUT:]
        return (view.exit_code if view.status == "exited" else None), output

    def put(self, path: str, data: bytes) -> None:
        _, vm_id = self._held()
        with self.deps.store.read() as tx:
            vm = tx.vms.get(vm_id)
        assert vm is not None
        self.deps.guests.files.write_file(vm, path, data, 0o600)

    def answers(self, port: int) -> bool:
        _, vm_id = self._held()
        with self.deps.store.read() as tx:
            vm = tx.vms.get(vm_id)
        assert vm is not None
        try:
            channel = self.deps.guests.files.open_port(vm, port, 2.0)
        except (PortClosed, RiftError):
            return False
        channel.close()
        return True

    def save_layer(self, name: str, *, last: bool = False) -> None:
        handle, vm_id = self._held()
        if self.forked_at is not None:  # its SSH server's restart done before the save
            time.sleep(max(0.0, self.forked_at + FORK_SETTLE_S - time.monotonic()))
        if last:  # its VM goes next: saved and stopped, not run on (no restore, no login)
            with self.deps.store.read() as tx:
                vm = tx.vms.get(vm_id)
            assert vm is not None
            folder = last_folder(self.deps, self.build_id)
            if folder is not None:
                try:
                    layer_from_vm(self.deps, name, vm, folder)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
                self.vm_id = None
                return
        snap = snapshots.make(self.deps, self.caller, VmSnapshotIn(handle=handle, vm_id=vm_id))
        try:
            add_image_from_snapshot(self.deps, ImageFromSnapshotIn(
                name=name, snapshot_id=snap.snapshot.id), flatten=False)
        finally:
            snapshots.delete(self.deps, self.caller, VmSnapshotDeleteIn(
                handle=handle, snapshot_id=snap.snapshot.id))

    def close(self) -> None:
        if self.handle is not None:
            tasks.close(self.deps, self.caller, TaskCloseIn(handle=self.handle))
            self.handle = self.vm_id = None
