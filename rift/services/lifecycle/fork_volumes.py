"""What a fork does with its source's volumes (SPEC §18): its VMs get the source's
read-only volumes, not its writable ones.

A fork's domain starts from the source's saved memory, so it holds the disks the
source held when saved (`Hypervisor.fork_state` answers them): a read-only
volume on the volume's own file, read-only, and a writable one on a stand-in (an
empty file the volume's size: QEMU would not open the volume a second time for
writing, and one writer at a time is the rule). Once the fork's guest answers,
each read-only volume its source holds read-only is recorded as the fork's
(`attached`, at the source's path, with a `volume_attached` event whose `from` is
`fork`); every other disk is unmounted in the guest where its path is known
(best effort) and unplugged, and a stand-in's file goes. The fork's view lists
what it got. An unplug refused fails the fork (its domain is taken down), so no
domain holds a disk no row knows.
"""

from __future__ import annotations

from contextlib import suppress

from hypervisor.base import HypervisorError, VolumeDisk
from rift.domain.errors import HypervisorFailed, RiftError, VolumeBusy
from rift.domain.model import NewEvent, Vm
from rift.domain.volumes import Attachment, check_attachable
from rift.services.context import Deps
from rift.services.lifecycle.launch import Start
from rift.services.lifecycle.volume_ends import mounts_of


def carry(deps: Deps, actor: str, start: Start, held: list[VolumeDisk],
          source_vm_id: str) -> list[str]:
    """Record the read-only volumes the fork (`start.vm`) keeps of those its source
    holds now, unplug the rest (above); answers the volume ids kept.
    HypervisorFailed when an unplug is refused."""
    vm, uri = start.vm, start.uri
    with deps.store.read() as tx:
        source = {att.volume_id: att for att in tx.volumes.of_vms([source_vm_id])[source_vm_id]}
    hv = deps.hosts.hypervisor(uri)
    kept = []
    for disk in held:
        att = source.get(disk.serial)
        if disk.read_only and att is not None and att.read_only and _record(
                deps, actor, vm, disk, att):
            kept.append(disk.serial)
            continue
        if att is not None:
            try:
                mounts_of(deps, vm).unmount(vm, att.path)
            except RiftError as exc:
                deps.log.warning("a fork's volume it does not get was not unmounted", extra={
                    "vm_id": vm.id, "volume_id": disk.serial, "error": exc.message})
        try:
            hv.detach_disk(vm.domain_name, disk)
        except HypervisorError as exc:
            raise HypervisorFailed(f"the fork's disk of {disk.serial} could not be "
                                   f"unplugged: {exc}", host=vm.host) from exc
        if not disk.read_only and disk.path != deps.volume_files.path(uri, disk.serial):
            with suppress(OSError):  # a stand-in, never the volume's own file
                hv.disk.remove(disk.path)
    return kept


def _record(deps: Deps, actor: str, vm: Vm, disk: VolumeDisk, att: Attachment) -> bool:
    now = deps.clock.now()
    with deps.store.write() as tx:
        volume = tx.volumes.get(disk.serial, lock=True)
        if volume is None or volume.owner != vm.owner or volume.state != "ready":
            return False
        try:
            check_attachable(volume, tx.volumes.holders(volume.id), True)
        except VolumeBusy:
            return False
        tx.volumes.attach(Attachment(volume.id, vm.id, vm.task_id, att.path, True,
                                     disk.target, "attached", now))
        tx.events.add(NewEvent(vm.task_id, "volume_attached", now, actor, {
            "vm_id": vm.id, "volume_id": volume.id, "path": att.path, "read_only": True,
            "from": "fork"}))
    return True
