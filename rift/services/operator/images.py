"""Operators' images: removing one (refused while a live VM was made from it), and
`rift image add NAME --snapshot SNAP_ID`, which turns one task's snapshot into an
image that every user's VMs start from (hypervisor.snapshot_image has the files;
rift.services.lifecycle.guest_kinds.SnapshotGuest starts its VMs). A plain
`rift image add` needs no engine: hypervisor.qcow2.add_qcow2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hypervisor.base import ImageError, elsewhere
from hypervisor.manifest import sha256_file
from hypervisor.qcow2 import KIND_KERNEL, MANIFEST, image_kind
from hypervisor.qcow2 import remove_image as remove_image_files
from hypervisor.snapshot_image import (
    KIND_SNAPSHOT,
    SnapshotSource,
    add_snapshot_image,
    snapshot_image,
)
from rift.contract.operator import ImageFromSnapshotIn
from rift.domain.builds import LAYER_PREFIX
from rift.domain.errors import InvalidArgument, SnapshotNotFound
from rift.domain.model import Vm
from rift.services.context import Deps
from rift.services.lifecycle.guest_kinds import vm_files
from rift.services.lifecycle.snapshot_files import DISK_FILE, STATE_FILE, snapshot_dir


def _images_dir(deps: Deps) -> Path:
    return deps.runtime.images("image")


def live_vms_of_image(deps: Deps, name: str) -> list[str]:
    """Ids of the live VMs (creating, running, paused or sleeping) made from image
    `name`, on any host."""
    with deps.store.read() as tx:
        return sorted(vm.id for host in tx.hosts.all()
                      for vm in tx.fleet.live_on_host(host.name) if vm.image == name)


def check_unused(deps: Deps, name: str, field: str, doing: str) -> None:
    """`invalid_argument` on `field` while a VM reads image `name`'s files: a live
    VM's overlay, or a pooled VM's (running or saved), which `doing` (removing the
    image, building it again) would pull from under it."""
    users = live_vms_of_image(deps, name)
    if users:
        raise InvalidArgument(field, f"image {name!r} is in use by live VMs "
                              f"{', '.join(users)}; destroy them (rift task close) "
                              f"before {doing}")
    with deps.store.read() as tx:
        pooled = sorted(pvm.id for pvm in tx.pool_vms.all() if pvm.image == name)
    if pooled:
        raise InvalidArgument(field, f"image {name!r} is in use by pooled VMs "
                              f"{', '.join(pooled)}; rift pool clear {name} before {doing}")


def remove_image(deps: Deps, name: str) -> None:
    """Delete image `name`, unless a VM reads it (`check_unused`)."""
    check_unused(deps, name, "image", "removing it")
    images_dir = _images_dir(deps)
    try:
        remove_image_files(images_dir, name)
    except ImageError as exc:
        raise InvalidArgument("image", str(exc)) from exc


def add_image_from_snapshot(deps: Deps, cmd: ImageFromSnapshotIn, *,
                            flatten: bool = True) -> Path:
    """Make image `name` from the ready snapshot `snapshot_id` (of any task) and
    answer its folder. The snapshot stays its task's; the image is a copy.
    Refused: no such ready snapshot (snapshot_not_found), a name that is taken or
    malformed, a control plane without real guests, files that cannot be copied
    (invalid_argument, saying which). A build's layer is not `flatten`ed: its disk
    stays an overlay on the image its VM started from (SPEC §19)."""
    name, snapshot_id = cmd.name, cmd.snapshot_id
    images_dir = deps.runtime.images("snapshot_id")
    with deps.store.read() as tx:
        snap = tx.snapshots.get(snapshot_id)
        source_vm = tx.vms.get(snap.vm_id) if snap is not None else None
    folder = snapshot_dir(deps, snapshot_id)
    if snap is None or snap.state != "ready" or folder is None:
        raise SnapshotNotFound(snapshot_id)
    with deps.store.read() as tx:
        host = tx.hosts.get(snap.host)
    if host is not None and elsewhere(host.uri):
        raise InvalidArgument("snapshot_id", f"{snapshot_id} is kept on host {snap.host}, "
                              "another machine; an image is made from a snapshot kept on "
                              "this one (of a VM on a host here)")
    if source_vm is not None and source_vm.egress != "open":
        # Its network is in the saved state, and an image's VMs are `open` (SPEC §13).
        raise InvalidArgument("snapshot_id", f"{snapshot_id} is of a VM whose egress is not "
                              "open; an image is made from a snapshot of an `open` VM")
    origin_kind = image_kind(images_dir, snap.image) or KIND_KERNEL
    try:
        if origin_kind == KIND_SNAPSHOT:  # a snapshot of a VM of a snapshot image
            origin_kind = snapshot_image(images_dir, snap.image).origin_kind
        disk = folder / DISK_FILE
        source = SnapshotSource(
            snapshot_id=snap.id, image=snap.image, origin_kind=origin_kind,
            state=folder / STATE_FILE, disk=disk if disk.is_file() else None,
            key=deps.guests.keys.task_key_file(snap.task_id), host_key=snap.host_key,
            vcpus=snap.vcpus, memory_mib=snap.memory_mib, disk_gib=snap.disk_gib)
        made = add_snapshot_image(images_dir, name, source, flatten=flatten)
    except ImageError as exc:
        raise InvalidArgument("name", str(exc)) from exc
    deps.log.info("image added from a snapshot", extra={
        "image": name, "snapshot_id": snap.id, "from_image": snap.image})
    return made


def layer_from_vm(deps: Deps, name: str, vm: Vm, snapshot_dir: Path) -> None:
    """A build's last layer (SPEC §19) from its running VM, which stops there: its
    memory saved into `snapshot_dir` (libvirt's save: the domain stops and is not
    run again), a copy of its overlay beside it, then both kept as the hidden image
    `name` (its disk an overlay on the image the VM started from). A snapshot's
    restore and login would only be thrown away with the VM right after."""
    images_dir = deps.runtime.images("name")
    with deps.store.read() as tx:
        host = tx.hosts.get(vm.host)
    if host is None or elsewhere(host.uri):
        raise InvalidArgument("name", f"a build's VM runs on host {vm.host}, not here")
    hv = deps.hosts.hypervisor(host.uri)
    host_key = deps.guests.keys.host_key(vm.id)
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    state, disk = snapshot_dir / STATE_FILE, snapshot_dir / DISK_FILE
    deps.guests.lifecycle.drop_connections(vm.id)
    hv.save_state(vm.domain_name, str(state))
    overlay = vm_files(deps).overlay_path(vm.id)
    if overlay is not None and overlay.is_file():
        hv.disk.copy_sparse(str(overlay), str(disk))
    origin_kind = image_kind(images_dir, vm.image) or KIND_KERNEL
    try:
        if origin_kind == KIND_SNAPSHOT:
            origin_kind = snapshot_image(images_dir, vm.image).origin_kind
        source = SnapshotSource(
            snapshot_id=f"last-of-{vm.task_id}", image=vm.image, origin_kind=origin_kind,
            state=state, disk=disk if disk.is_file() else None,
            key=deps.guests.keys.task_key_file(vm.task_id), host_key=host_key,
            vcpus=vm.vcpus, memory_mib=vm.memory_mib, disk_gib=vm.disk_gib)
        add_snapshot_image(images_dir, name, source, flatten=False)
    except ImageError as exc:
        raise InvalidArgument("name", str(exc)) from exc


HALF_WRITTEN = ".add-" + LAYER_PREFIX  # a layer's work folder that a cut left


class FolderLayers:
    """The LayerFiles port of builds (SPEC §19) over the images folder: layers and
    built images are snapshot images; a built image is a standalone copy of its
    last layer (its disk flattened), so layers can go without breaking it."""

    def __init__(self, images_dir: Path) -> None:
        self.images_dir = images_dir

    def exists(self, name: str) -> bool:
        try:
            snapshot_image(self.images_dir, name)
        except ImageError:
            return False
        return True

    def identity(self, image: str) -> str:
        manifest = self.images_dir / image / MANIFEST
        return sha256_file(manifest) if manifest.is_file() else ""

    def image_from(self, layer: str, name: str) -> None:
        made = snapshot_image(self.images_dir, layer)
        facts = json.loads((self.images_dir / layer / MANIFEST).read_text())
        source = SnapshotSource(
            snapshot_id=str(facts["source"]["snapshot_id"]), image=layer,
            origin_kind=made.origin_kind, state=made.state, disk=made.disk, key=made.key,
            host_key=made.host_key, vcpus=made.vcpus, memory_mib=made.memory_mib,
            disk_gib=made.disk_gib)
        if (self.images_dir / name).exists():
            remove_image_files(self.images_dir, name)
        add_snapshot_image(self.images_dir, name, source)

    def remove(self, name: str) -> None:
        if name.startswith(HALF_WRITTEN):  # a work folder (hypervisor.qcow2.new_image_folder)
            shutil.rmtree(self.images_dir / name, ignore_errors=True)
        elif (self.images_dir / name).exists():
            remove_image_files(self.images_dir, name)

    def stray(self) -> list[str]:
        if not self.images_dir.is_dir():
            return []
        return sorted(p.name for p in self.images_dir.iterdir()
                      if p.name.startswith((LAYER_PREFIX, HALF_WRITTEN)))

    def backing(self, name: str) -> str | None:
        try:
            facts = json.loads((self.images_dir / name / MANIFEST).read_text())
            path = Path(str((facts.get("disk") or {}).get("backing") or ""))
        except (OSError, ValueError, AttributeError):
            return None
        return path.parent.name if path.parent.parent == self.images_dir.resolve() else None
