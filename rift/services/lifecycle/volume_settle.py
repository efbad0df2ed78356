"""Attaches and detaches a crash cut (SPEC §18, §13): settled by every sweep.

An attach records its attachment `attaching` before libvirt plugs the disk, and
a detach marks it `detaching` before the guest unmounts it; a crash of `rift
serve` in between leaves the row so, with the disk plugged or not. The sweep
finishes each toward detached, the one end that needs nothing the crash lost
(the caller of a cut attach had no answer, so nothing relies on it): the guest
unmounts the path (best effort, as at a VM's end), libvirt unplugs the disk
from the domain and its definition (nothing when the domain does not hold it),
and only then does the row go, with a `volume_detached` event whose `reason`
says which change was cut. So no domain holds a volume that no row knows, and
a volume a cut attach took for writing is free again for one writer.

An `attaching` row is settled only once `RIFT_VM_CREATING_GRACE_S` has passed
since it was made (an attach under way is not cut; one that outlives the grace
finds its row gone, unplugs and fails: rift.services.lifecycle.volume_attach).
A `detaching` row is settled at the next sweep: a detach under way that races
it unplugs the same disk, and only one of them drops the row and tells. A VM
that is not running (paused, sleeping, changing) keeps its cut attachment until
it runs again; its end drops it (volume_ends)."""

from __future__ import annotations

from datetime import timedelta

from hypervisor.base import HypervisorError
from rift.domain.errors import RiftError
from rift.domain.model import NewEvent, Vm
from rift.domain.volumes import Attachment
from rift.services.context import SWEEP, Deps
from rift.services.lifecycle.volume_attach import disk_of
from rift.services.lifecycle.volume_ends import mounts_of

REASONS = {"attaching": "attach_interrupted", "detaching": "detach_interrupted"}


def settle_attachments(deps: Deps) -> list[str]:
    """Finish every cut attach and detach (above); answers `vm_id/volume_id` of each."""
    stale = deps.clock.now() - timedelta(seconds=deps.limits.creating_grace_s)
    cut: list[tuple[Attachment, Vm, str]] = []
    with deps.store.read() as tx:
        for att in tx.volumes.unsettled():
            vm = tx.vms.get(att.vm_id)
            if vm is None or vm.status != "running" or vm.change is not None:
                continue
            if att.state == "attaching" and att.created_at >= stale:
                continue
            host = tx.hosts.get(vm.host)
            if host is not None:
                cut.append((att, vm, host.uri))
    return [f"{att.vm_id}/{att.volume_id}" for att, vm, uri in cut
            if _settle(deps, att, vm, uri)]


def _settle(deps: Deps, att: Attachment, vm: Vm, uri: str) -> bool:
    try:
        mounts_of(deps, vm).unmount(vm, att.path)
    except RiftError as exc:
        deps.log.warning("a cut attachment's volume was not unmounted", extra={
            "vm_id": vm.id, "volume_id": att.volume_id, "error": exc.message})
    try:
        deps.hosts.hypervisor(uri).detach_disk(vm.domain_name, disk_of(deps, uri, att))
    except HypervisorError as exc:
        deps.log.warning("a cut attachment's disk was not unplugged", extra={
            "vm_id": vm.id, "volume_id": att.volume_id, "error": str(exc)})
        return False  # the row stays; the next sweep tries again
    with deps.store.write() as tx:
        now = [a for a in tx.volumes.of_vms([vm.id])[vm.id] if a.volume_id == att.volume_id]
        if not now or now[0].state != att.state:
            return False  # its own call finished it meanwhile
        tx.volumes.detach(vm.id, att.volume_id)
        tx.events.add(NewEvent(att.task_id, "volume_detached", deps.clock.now(), SWEEP, {
            "vm_id": vm.id, "volume_id": att.volume_id, "path": att.path,
            "read_only": att.read_only, "reason": REASONS[att.state]}))
    deps.log.warning("cut volume change settled", extra={
        "vm_id": vm.id, "volume_id": att.volume_id, "was": att.state})
    return True
