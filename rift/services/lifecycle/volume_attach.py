"""Attaching volumes to VMs (SPEC §18): `rift_vm_attach_volume` and
`rift_vm_detach_volume`.

An attach is recorded first (`attaching`, in the transaction that checks the
handle, the VM running, the volume the caller's and the one-writer rule with the
volume's row locked), then the disk is hot-plugged (libvirt, live and into the
definition, so pause and sleep keep it) and mounted in the guest at `path`, then
the attachment is `attached` with its `volume_attached` event. A failed step
unplugs what was plugged and drops the row. A detach marks it `detaching`,
unmounts (what is cached is written first), unplugs, and drops the row with
`volume_detached`. A sleeping VM is woken first (SPEC §17); a paused one is
`vm_not_running`."""

from __future__ import annotations

from contextlib import suppress

from hypervisor.base import HypervisorError, VolumeDisk
from rift.contract.vms import VmOut
from rift.contract.volumes import VmAttachVolumeIn, VmDetachVolumeIn
from rift.domain.errors import (
    HypervisorFailed,
    InvalidArgument,
    RiftError,
    VmNotRunning,
    VolumeBusy,
    VolumeNotFound,
)
from rift.domain.model import NewEvent, Vm
from rift.domain.volumes import Attachment, check_attachable, free_target, mount_path
from rift.services.context import Caller, Deps
from rift.services.lifecycle.leases import (
    check_handle,
    check_running,
    in_write,
    parse_handle,
    task_vm,
)
from rift.services.lifecycle.sleeps import awake
from rift.services.lifecycle.volume_ends import mounts_of
from rift.services.lifecycle.volume_hosts import answering
from rift.services.lifecycle.volumes import host_uri, owned_volume
from rift.services.ports import Tx
from rift.services.read import views


def _details(att: Attachment) -> dict[str, object]:
    return {"vm_id": att.vm_id, "volume_id": att.volume_id, "path": att.path,
            "read_only": att.read_only}


def disk_of(deps: Deps, uri: str, att: Attachment) -> VolumeDisk:
    return VolumeDisk(deps.volume_files.path(uri, att.volume_id), att.target, att.volume_id,
                      att.read_only)


def not_moving(vm: Vm) -> None:
    """A VM being moved (`rift host drain --move`) takes no attach or detach: the
    move carries the volumes it held when it began."""
    if vm.change == "moving":
        raise VmNotRunning(vm.id, vm.status, doing=vm.change)


def attach(deps: Deps, caller: Caller, cmd: VmAttachVolumeIn) -> VmOut:
    """`rift_vm_attach_volume`: plug the volume into the running VM and mount it."""
    parsed = parse_handle(cmd.handle)
    path = mount_path(cmd.path)
    now = deps.clock.now()

    def work(tx: Tx) -> tuple[Vm, Attachment, str]:
        task = check_handle(deps, tx, caller, parsed, now)
        vm = task_vm(tx, task, cmd.vm_id, running=True)
        not_moving(vm)
        volume = answering(deps, tx, owned_volume(tx, caller, cmd.volume_id, lock=True),
                           vm.host)  # its host lost: taken to the VM's (volume_hosts)
        if volume.host != vm.host:
            raise InvalidArgument("volume_id", f"{volume.id} is on host {volume.host}, "
                                  f"{vm.id} on {vm.host}")
        holders = tx.volumes.holders(volume.id)
        for held in holders:
            if held.vm_id == vm.id:
                raise VolumeBusy(volume.id, vm.id, task.id, "it is attached to that VM already")
        check_attachable(volume, holders, cmd.read_only)
        mine = tx.volumes.of_vms([vm.id])[vm.id]
        if any(att.path == path for att in mine):
            raise InvalidArgument("path", f"another volume is mounted at {path}")
        att = Attachment(volume.id, vm.id, task.id, path, cmd.read_only,
                         free_target([a.target for a in mine]), "attaching", now)
        tx.volumes.attach(att)
        return vm, att, host_uri(tx, vm.host)

    vm, att, uri = awake(deps, caller.label, lambda: in_write(deps.store, work))
    disk = disk_of(deps, uri, att)
    hypervisor = deps.hosts.hypervisor(uri)
    try:
        try:
            hypervisor.attach_disk(vm.domain_name, disk)
        except HypervisorError as exc:
            raise HypervisorFailed(str(exc), host=vm.host) from exc
        try:
            mounts_of(deps, vm).mount(vm, att.volume_id, path, att.read_only)
        except RiftError:
            with suppress(HypervisorError):
                hypervisor.detach_disk(vm.domain_name, disk)
            raise
    except RiftError:
        with deps.store.write() as tx:
            tx.volumes.detach(vm.id, att.volume_id)
        raise
    with deps.store.write() as tx:
        won = tx.volumes.save_attachment(att.attached(), att)
        if won:
            tx.events.add(NewEvent(att.task_id, "volume_attached", deps.clock.now(),
                                   caller.label, _details(att)))
    if not won:  # a sweep took it for a cut attach (rift.services.lifecycle.volume_settle)
        with suppress(RiftError):
            mounts_of(deps, vm).unmount(vm, path)
        with suppress(HypervisorError):
            hypervisor.detach_disk(vm.domain_name, disk)
        raise HypervisorFailed(f"the attach of {att.volume_id} took longer than "
                               "RIFT_VM_CREATING_GRACE_S and was undone", host=vm.host)
    with deps.store.read() as tx:
        return VmOut(vm=views.vm(tx, tx.vms.get(vm.id) or vm))


def detach(deps: Deps, caller: Caller, cmd: VmDetachVolumeIn) -> VmOut:
    """`rift_vm_detach_volume`: unmount and unplug; one not attached changes nothing."""
    parsed = parse_handle(cmd.handle)
    now = deps.clock.now()

    def work(tx: Tx) -> tuple[Vm, Attachment | None, str]:
        task = check_handle(deps, tx, caller, parsed, now)
        vm = task_vm(tx, task, cmd.vm_id, running=False)
        volume = tx.volumes.get(cmd.volume_id)
        if volume is None or volume.owner != caller.user:
            raise VolumeNotFound(cmd.volume_id)
        found = [a for a in tx.volumes.of_vms([vm.id])[vm.id] if a.volume_id == volume.id]
        if not found:
            return vm, None, ""
        check_running(vm)
        not_moving(vm)
        att = found[0]
        if att.state != "attached":
            raise InvalidArgument("volume_id", f"{volume.id} is being {att.state[:-3]}ed on "
                                  f"{vm.id}; call again")
        tx.volumes.save_attachment(att.detaching(), att)
        return vm, att, host_uri(tx, vm.host)

    vm, att, uri = awake(deps, caller.label, lambda: in_write(deps.store, work))
    if att is not None:
        detaching = att.detaching()
        try:
            mounts_of(deps, vm).unmount(vm, att.path)
            try:
                deps.hosts.hypervisor(uri).detach_disk(vm.domain_name, disk_of(deps, uri, att))
            except HypervisorError as exc:
                raise HypervisorFailed(str(exc), host=vm.host) from exc
        except RiftError:
            with deps.store.write() as tx:
                tx.volumes.save_attachment(detaching.kept(), detaching)  # as it was
            raise
        with deps.store.write() as tx:
            if tx.volumes.detach(vm.id, att.volume_id):
                tx.events.add(NewEvent(att.task_id, "volume_detached", deps.clock.now(),
                                       caller.label, _details(att)))
    with deps.store.read() as tx:
        return VmOut(vm=views.vm(tx, tx.vms.get(vm.id) or vm))
