"""Forks (SPEC §12): new VMs started from a snapshot, or from a running VM
snapshotted first; all or none.

The snapshot is the handle's task's, or another open task's of the same user (the
E2B door forks a sandbox into sandboxes of their own, each a task): such a fork
boots knowing the snapshot's task's key, kept as its boot key, and its first
login hands it over to its own task's key (rift.guest.connections), as a VM of
a snapshot image is.

A fork is a new domain started from a snapshot's file under its own name, UUID,
disk, serial log and SSH port (`Hypervisor.fork_state`: libvirt restores a save
file only under the name and UUID in its header, so each fork gets a copy of
the file with its own XML, see hypervisor/save_image.py). Its disk is a copy of
the snapshot's; once it answers, the guest gets an identity of its own
(`GuestShell.forked`: a new SSH host key, MAC, entropy reseeded, clock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from datetime import datetime

from hypervisor.base import DomainSpec, HypervisorError, ImageError
from hypervisor.host_disk import HostDisk
from rift.contract.snapshots import VmForkIn, VmsOut
from rift.domain import egress as egress_rules
from rift.domain.errors import (
    GuestUnreachable,
    HypervisorFailed,
    InvalidArgument,
    NoCapacity,
    QuotaExceeded,
    SnapshotNotFound,
)
from rift.domain.ids import new_vm_id
from rift.domain.model import NewEvent, Task, Vm
from rift.domain.records import Snapshot
from rift.domain.secrets import Handle
from rift.services.context import Caller, Deps
from rift.services.lifecycle import code_records
from rift.services.lifecycle.capacity import host_loads, room
from rift.services.lifecycle.disk_budget import check_disk_budget, check_host_disk
from rift.services.lifecycle.fork_volumes import carry
from rift.services.lifecycle.guest_kinds import GuestKind, kind_on, mac_of
from rift.services.lifecycle.launch import SSH_HOST, Start, fail_start, pick_ssh_port, running
from rift.services.lifecycle.leases import check_handle, in_flight, in_write, parse_handle
from rift.services.lifecycle.sleeps import awake
from rift.services.lifecycle.snapshot_files import DISK_FILE, snapshot_dir, state_path
from rift.services.lifecycle.snapshots import Steps, begin, finish_delete, take, vm_to_snapshot
from rift.services.lifecycle.teardown import destroy_domain
from rift.services.ports import Tx
from rift.services.read import views


def fork(deps: Deps, caller: Caller, cmd: VmForkIn) -> VmsOut:
    """`rift_vm_fork`: `count` new VMs in the handle's task from a snapshot (or from a
    running VM, snapshotted first and that snapshot deleted after): all or none."""
    called = deps.clock.now()
    parsed = parse_handle(cmd.handle)
    snapshot_id, vm_id, how_many = cmd.snapshot_id, cmd.vm_id, cmd.count
    if (snapshot_id is None) == (vm_id is None):
        raise InvalidArgument("snapshot_id", "give snapshot_id or vm_id (one of them)")
    if vm_id is not None:
        _check_fork_room(deps, caller, parsed, vm_id, how_many)
        snap, vm, uri = begin(deps, caller, parsed, vm_id, f"fork of {vm_id}")
        snap = take(deps, caller, snap, vm, uri)
        try:
            return _fork(deps, caller, cmd, snap, called)
        finally:
            deleting, event = snap.deleting(caller.label, deps.clock.now(),
                                            "the fork started")
            with deps.store.write() as tx:
                if tx.snapshots.save(deleting, snap):
                    tx.events.add(event)
            finish_delete(deps, snap)
    assert snapshot_id is not None
    with deps.store.read() as tx:
        snap_row = tx.snapshots.get(snapshot_id)
    if snap_row is None or snap_row.owner != caller.user or snap_row.state != "ready":
        raise SnapshotNotFound(snapshot_id)
    return _fork(deps, caller, cmd, snap_row, called)


def _check_fork_room(deps: Deps, caller: Caller, parsed: Handle, vm_id: str,
                     count: int) -> None:
    """Before a running VM is snapshotted for a fork: refuse what the fork would."""
    def check(tx: Tx) -> None:
        task = check_handle(deps, tx, caller, parsed, deps.clock.now())
        vm = vm_to_snapshot(tx, task, vm_id)
        _check_quota_and_room(deps, tx, task, vm, count)

    awake(deps, caller.label, lambda: in_write(deps.store, check))  # SPEC §17: woken


def _check_quota_and_room(deps: Deps, tx: Tx, task: Task, like: Vm | Snapshot,
                          count: int) -> None:
    """Refuse `count` more VMs the size of `like`, on its host, in the task."""
    host, vcpus, memory_mib = like.host, like.vcpus, like.memory_mib
    limit = deps.limits.max_vms_per_task
    if tx.vms.count_live(task.id) + count > limit:
        raise QuotaExceeded(f"VMs per task ({limit})", limit, "rift_vm_destroy")
    check_disk_budget(deps, tx, task.owner)
    check_host_disk(deps, host)
    _, loads = host_loads(tx)
    load = next((load for load in loads if load.name == host), None)
    if load is None or room(load, vcpus, memory_mib) < count:
        raise NoCapacity(vcpus * count, memory_mib * count,
                         load.free_vcpus if load else 0, load.free_memory_mib if load else 0)


def _fork(deps: Deps, caller: Caller, cmd: VmForkIn, snap: Snapshot,
          called: datetime) -> VmsOut:
    parsed, name, count = parse_handle(cmd.handle), cmd.name, cmd.count

    def record(tx: Tx) -> tuple[list[Vm], str]:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        current = tx.snapshots.get(snap.id)  # the task's, or another open task's of its user
        if current is None or current.owner != task.owner or current.state != "ready":
            raise SnapshotNotFound(snap.id)
        _check_quota_and_room(deps, tx, task, snap, count)
        host = tx.hosts.get(snap.host)
        assert host is not None
        kind = kind_on(deps, host.uri, snap.image)
        source = tx.vms.get(snap.vm_id)  # its network is in the saved state: so is its egress
        egress = source.egress if source is not None else "open"
        made = []
        for n in range(count):
            fork_id = new_vm_id()
            port = kind.ssh_port(lambda: pick_ssh_port(tx, host.name))
            label = name if count == 1 else f"{name}-{n + 1}" if name else None
            vm = Vm(id=fork_id, task_id=task.id, owner=caller.user, name=label or fork_id,
                    image=snap.image, status="creating", host=host.name, vcpus=snap.vcpus,
                    memory_mib=snap.memory_mib, disk_gib=snap.disk_gib, created_at=now,
                    ssh_host=SSH_HOST if port else None, ssh_port=port, egress=egress)
            tx.vms.add(vm)
            if cmd.vm_id is not None:  # its snapshot taken for it: the source's contexts now
                code_records.forked(tx, cmd.vm_id, vm)
            else:  # the source's contexts when the snapshot was taken
                code_records.forked(tx, snap.vm_id, vm, as_of=snap.created_at)
            tx.events.add(NewEvent(task.id, "vm_creating", now, caller.label, {
                "vm_id": fork_id, "name": vm.name, "image": vm.image, "host": host.name,
                "vcpus": vm.vcpus, "memory_mib": vm.memory_mib, "disk_gib": vm.disk_gib,
                "egress": egress_rules.view(egress), "start": "fork",
                "from": {"snapshot_id": snap.id, "vm_id": snap.vm_id}}))
            made.append(vm)
        return made, host.uri

    vms, uri = in_write(deps.store, record)
    kind = kind_on(deps, uri, snap.image)
    answers: dict[str, Vm] = {}

    def start(vm: Vm) -> None:
        answers[vm.id] = _start_fork(deps, caller, Start(vm, uri, called), snap, kind)

    with in_flight(deps, vms[0].task_id, deps.runtime.boot_timeout_s):
        _all_at_once([lambda vm=vm: start(vm) for vm in vms])  # type: ignore[misc]
    with deps.store.read() as tx:  # with the read-only volumes each kept (fork_volumes)
        return VmsOut(vms=[views.vm(tx, answers.get(vm.id, vm)) for vm in vms])


def _all_at_once(calls: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=call, name="rift-fork", daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _start_fork(deps: Deps, caller: Caller, start: Start, snap: Snapshot,
                kind: GuestKind) -> Vm:
    """Start one fork from the snapshot's file and give its guest its own identity;
    the row turns `running` (`start.kind` fork) or `failed`."""
    vm, uri = start.vm, start.uri
    steps = Steps()
    hv = deps.hosts.hypervisor(uri)
    try:
        spec = _fork_spec(deps, kind, start, snap, hv.disk)
        steps.done("files")
        held = hv.fork_state(state_path(deps, snap.id), spec)
        steps.done("restore")
    except (HypervisorError, ImageError, HypervisorFailed, OSError) as exc:
        kind.clean_up(vm.id)
        return fail_start(deps, caller, vm, f"the fork could not start: {exc}")
    if vm.ssh_port is not None:
        timeout_s = deps.runtime.boot_timeout_s
        boot_key = None
        if snap.task_id != vm.task_id:  # its guest knows the snapshot's task's key: handed over
            deps.guests.keys.task_key(vm.task_id)  # the key it is handed over to, made now
            boot_key = deps.guests.keys.task_key_file(snap.task_id)
        try:
            deps.guests.lifecycle.forked(vm, snap.host_key, mac_of(vm.id), timeout_s,
                                         boot_key=boot_key)
        except GuestUnreachable as exc:
            with suppress(HypervisorFailed):  # else reconciliation takes the domain down
                destroy_domain(deps, vm, uri)
            return fail_start(deps, caller, vm, f"the fork did not answer: {exc.message}")
        steps.done("identity")
    try:
        carry(deps, caller.label, start, held, snap.vm_id)  # SPEC §18: read-only volumes only
    except HypervisorFailed as exc:
        with suppress(HypervisorFailed):
            destroy_domain(deps, vm, uri)
        return fail_start(deps, caller, vm, f"the fork could not start: {exc.message}")
    deps.log.info("vm forked", extra={"vm_id": vm.id, "snapshot_id": snap.id, **steps.ms})
    return running(deps, caller, start, "fork",
                   {"from": {"snapshot_id": snap.id, "vm_id": snap.vm_id}})


def _fork_spec(deps: Deps, kind: GuestKind, start: Start, snap: Snapshot,
               disk: HostDisk) -> DomainSpec:
    """The fork's domain (its kind's plan: files named by its id, put on its host
    when that is elsewhere) with, for an image with a disk, the snapshot's disk
    copied in as its own, on the host both are on."""
    spec = replace(kind.plan(start.vm), install=deps.install_id)
    deps.host_files.prepare(start.uri, spec)
    folder = snapshot_dir(deps, snap.id)
    if spec.disk is not None and folder is not None and disk.is_file(str(folder / DISK_FILE)):
        disk.copy_sparse(str(folder / DISK_FILE), spec.disk)
    return spec
