"""What a VM's end does to its volumes (SPEC §18): they are detached, never
deleted. Before its domain goes, its guest unmounts them (what it cached is
written to the volume: a destroy is a power cut); in the transaction that ends
the VM, its attachments go with a `volume_detached` event each (its ender in
rift.services.lifecycle.teardown). Apart from the attach use cases, which wake a
sleeping VM through `sleeps` and so must not be imported by teardown."""

from __future__ import annotations

from datetime import datetime

from rift.domain.errors import RiftError
from rift.domain.model import NewEvent, Vm
from rift.services.absent import NoGuestMounts
from rift.services.context import Deps
from rift.services.ports import GuestMounts, Tx


def mounts_of(deps: Deps, vm: Vm) -> GuestMounts:
    """Where `vm`'s volumes are mounted: its guest; nowhere for a VM with no guest
    behind its domain (no SSH address: libvirt's test driver)."""
    return deps.mounts if vm.ssh_port is not None else NoGuestMounts()


def before_end(deps: Deps, vm: Vm) -> None:
    """Best effort, before the domain is destroyed: unmount the VM's volumes in its
    guest (a guest that does not answer loses what it had not written)."""
    if vm.status != "running" or vm.change is not None:
        return
    with deps.store.read() as tx:
        attached = tx.volumes.of_vms([vm.id])[vm.id]
    for att in attached:
        try:
            mounts_of(deps, vm).unmount(vm, att.path)
        except RiftError as exc:
            deps.log.warning("a volume was not unmounted before its VM ended", extra={
                "vm_id": vm.id, "volume_id": att.volume_id, "error": exc.message})


def end_for_vm(tx: Tx, vm: Vm, now: datetime, actor: str) -> None:
    """The VM ended (rift.services.lifecycle.teardown.vm_ended): its volumes are
    detached (the domain that held them is gone), each with its event."""
    for att in tx.volumes.detach(vm.id):
        tx.events.add(NewEvent(att.task_id, "volume_detached", now, actor, {
            "vm_id": vm.id, "volume_id": att.volume_id, "path": att.path,
            "read_only": att.read_only, "reason": "vm_ended"}))
