"""Snapshots (SPEC §12): a VM's memory and disk kept as of one moment, for forks
(`forks.py`).

A snapshot saves the running VM to a file (libvirt's virDomainSave: the domain
stops), copies its overlay beside it and keeps its volumes as they are
(`volume_snapshots`) while it is stopped, and restores the VM
from the same file at once: the VM goes on where it was, after a pause of about
a restore's length. Its files live on the VM's host (`snapshot_files.py`). The
row is `making` before libvirt is asked (with the VM's `change` `snapshotting`),
`ready` after, and `deleting` while its files go; a crash in between is settled
by the sweep (`settle_snapshots`): a cut snapshot's files go, and a VM left
stopped after its save runs again from the file.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

from hypervisor.base import HypervisorError, ImageError
from hypervisor.host_disk import HostDisk
from rift.contract.snapshots import SnapshotOut, VmSnapshotDeleteIn, VmSnapshotIn
from rift.domain.errors import (
    GuestUnreachable,
    HypervisorFailed,
    QuotaExceeded,
    SnapshotNotFound,
    VmNotRunning,
)
from rift.domain.ids import new_snapshot_id
from rift.domain.model import Task, Vm
from rift.domain.records import Snapshot, SnapshotState
from rift.domain.secrets import Handle
from rift.services.context import SWEEP, Caller, Deps
from rift.services.lifecycle.disk_budget import check_disk_budget, check_host_disk
from rift.services.lifecycle.guest_kinds import vm_files
from rift.services.lifecycle.leases import check_handle, in_write, parse_handle, task_vm
from rift.services.lifecycle.sleeps import awake
from rift.services.lifecycle.snapshot_files import (
    DISK_FILE,
    host_disk,
    remove_files,
    snapshot_dir,
    state_path,
)
from rift.services.lifecycle.volume_snapshots import flush_held, freeze_held
from rift.services.ports import Tx
from rift.services.read import views


def make(deps: Deps, caller: Caller, cmd: VmSnapshotIn) -> SnapshotOut:
    """`rift_vm_snapshot`: snapshot a running VM of the handle's task; it runs on after."""
    parsed = parse_handle(cmd.handle)
    snap, vm, uri = begin(deps, caller, parsed, cmd.vm_id, cmd.name)
    made = take(deps, caller, snap, vm, uri)
    with deps.store.read() as tx:  # with the volumes it keeps
        return SnapshotOut(snapshot=views.snapshot_now(tx, made))


def begin(deps: Deps, caller: Caller, parsed: Handle, vm_id: str,
           name: str | None) -> tuple[Snapshot, Vm, str]:
    snapshot_id = new_snapshot_id()

    def begin(tx: Tx) -> tuple[Snapshot, Vm, str]:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        vm = vm_to_snapshot(tx, task, vm_id)
        limit = deps.limits.max_snapshots_per_task
        if len(tx.snapshots.of_task(task.id)) >= limit:
            raise QuotaExceeded(f"snapshots per task ({limit})", limit,
                                "rift_vm_snapshot_delete")
        check_disk_budget(deps, tx, caller.user)
        check_host_disk(deps, vm.host)
        host = tx.hosts.get(vm.host)
        if host is None:
            raise HypervisorFailed(f"host {vm.host} is not known", host=vm.host)
        snap = Snapshot(id=snapshot_id, task_id=task.id, vm_id=vm.id, owner=caller.user,
                        name=name or snapshot_id, host=vm.host, image=vm.image,
                        vcpus=vm.vcpus, memory_mib=vm.memory_mib, disk_gib=vm.disk_gib,
                        state="making", created_at=now)
        tx.snapshots.add(snap)
        if vm.status != "running" or vm.change is not None:
            raise VmNotRunning(vm.id, vm.status, doing="changing")
        changing = vm.changing("snapshotting", now)
        if not tx.vms.save(changing, vm):
            raise VmNotRunning(vm.id, vm.status, doing="changing")
        return snap, changing, host.uri

    return awake(deps, caller.label, lambda: in_write(deps.store, begin))  # SPEC §17


def vm_to_snapshot(tx: Tx, task: Task, vm_id: str) -> Vm:
    """The task's running VM (leases.task_vm), not one whose destroy is under way."""
    vm = task_vm(tx, task, vm_id)
    if vm.destroy_requested_at:
        raise VmNotRunning(vm_id, vm.status)
    return vm


def take(deps: Deps, caller: Caller, snap: Snapshot, vm: Vm, uri: str) -> Snapshot:
    """Save the VM to the snapshot's file, copy its disk, and run it on from the file."""
    hv = deps.hosts.hypervisor(uri)
    folder = snapshot_dir(deps, snap.id)
    state = state_path(deps, snap.id)
    host_key = deps.guests.keys.host_key(vm.id)
    steps = Steps()
    try:
        if folder is not None:
            hv.disk.make_dir(str(folder))
        flush_held(deps, vm)  # the guest writes out what its volumes cache
        deps.guests.lifecycle.drop_connections(vm.id)
        hv.save_state(vm.domain_name, state)
        steps.done("save")
    except (HypervisorError, OSError) as exc:
        _abandon(deps, snap, vm, hv.disk)
        raise HypervisorFailed(f"the snapshot could not be saved: {exc}", host=vm.host) from exc
    failure: Exception | None = None
    overlay = vm_files(deps).overlay_path(vm.id)
    size, kept = 0, []  # the volumes it keeps (volume_snapshots.freeze_held)
    try:
        if overlay is not None and folder is not None and hv.disk.is_file(str(overlay)):
            hv.disk.copy_sparse(str(overlay), str(folder / DISK_FILE))
            steps.done("disk")
        kept = freeze_held(deps, vm, snap.id, uri)  # its volumes as they are (stopped)
        if kept:
            steps.done("volumes")
        size = hv.disk.usage(str(folder)) if folder is not None else 0
    except (OSError, ImageError) as exc:
        failure = exc  # a full disk: the VM runs on, the snapshot is not made
    try:
        hv.restore_state(state)
        steps.done("restore")
    except HypervisorError as exc:
        # The VM stopped and did not come back: the sweep tries again from the file.
        deps.log.error("vm did not run on after its snapshot", extra={
            "vm_id": vm.id, "snapshot_id": snap.id, "error": str(exc)})
        raise HypervisorFailed(f"the VM did not run on after its snapshot: {exc}",
                               host=vm.host) from exc
    _reconnect(deps, vm)
    steps.done("reconnect")
    if failure is not None:
        _abandon(deps, snap, vm, hv.disk)
        raise HypervisorFailed(f"the snapshot's disk could not be written: {failure}",
                               host=vm.host) from failure
    made, event = snap.made(size, host_key, caller.label, deps.clock.now())
    if kept:  # the volumes it keeps: its view lists them, rift_volume_clone clones them
        event = replace(event, details={**event.details,
                                        "volumes": [k.detail() for k in kept]})
    with deps.store.write() as tx:
        tx.snapshots.save(made, snap)
        _end_snapshotting(tx, vm.id)
        tx.events.add(event)
    deps.log.info("snapshot made", extra={"snapshot_id": snap.id, "vm_id": vm.id,
                                          "bytes": made.bytes, **steps.ms})
    return made


class Steps:
    """How long each step of a start took, in milliseconds, for its log line."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._mark = time.monotonic()

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.ms[f"{name}_ms"] = round((now - self._mark) * 1000, 1)
        self._mark = now


def _reconnect(deps: Deps, vm: Vm) -> None:
    if vm.ssh_port is None:
        return
    timeout_s = deps.runtime.boot_timeout_s
    try:
        deps.guests.lifecycle.resumed(vm, timeout_s)
    except GuestUnreachable as exc:  # it runs: its calls say what fails
        deps.log.warning("guest does not answer after its snapshot", extra={
            "vm_id": vm.id, "error": exc.message})


def _abandon(deps: Deps, snap: Snapshot, vm: Vm, disk: HostDisk) -> None:
    """A snapshot that was not made: its files and row go, the VM has no change."""
    remove_files(deps, snap.id, disk)
    with deps.store.write() as tx:
        _remove_row(tx, snap.id, "making")
        _end_snapshotting(tx, vm.id)


def _end_snapshotting(tx: Tx, vm_id: str) -> None:
    """The VM runs on with no change under way (where it is still snapshotting)."""
    vm = tx.vms.get(vm_id)
    if vm is not None and (vm.status, vm.change) == ("running", "snapshotting"):
        tx.vms.save(vm.change_ended(), vm)


# -- delete -------------------------------------------------------------------------------

def delete(deps: Deps, caller: Caller, cmd: VmSnapshotDeleteIn) -> SnapshotOut:
    """`rift_vm_snapshot_delete`: a snapshot of the handle's task and its files."""
    parsed = parse_handle(cmd.handle)
    snapshot_id = cmd.snapshot_id

    def mark(tx: Tx) -> Snapshot:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        snap = tx.snapshots.get(snapshot_id)
        if snap is None or snap.task_id != task.id or snap.state != "ready":
            raise SnapshotNotFound(snapshot_id)
        deleting, event = snap.deleting(caller.label, now)
        tx.snapshots.save(deleting, snap)
        tx.events.add(event)
        return snap

    snap = in_write(deps.store, mark)
    with deps.store.read() as tx:  # as it was, with the volumes it kept
        view = views.snapshot_now(tx, snap)
    finish_delete(deps, snap)
    return SnapshotOut(snapshot=view)


def finish_delete(deps: Deps, snap: Snapshot) -> None:
    remove_files(deps, snap.id, host_disk(deps, snap.host))
    with deps.store.write() as tx:
        _remove_row(tx, snap.id, "deleting")


def _remove_row(tx: Tx, snapshot_id: str, state: SnapshotState) -> None:
    """The snapshot's row goes while it is still `state` (a compare-and-set)."""
    current = tx.snapshots.get(snapshot_id)
    if current is not None and current.state == state:
        tx.snapshots.remove(current.removed())


def remove_task_snapshots(deps: Deps, task_id: str, actor: str) -> int:
    """A closed task's snapshots go, each with its event; answers how many."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        gone = [s for s in tx.snapshots.of_task(task_id) if s.state != "making"]
        for snap in gone:
            if snap.state != "ready":
                continue
            deleting, event = snap.deleting(actor, now, "task closed")
            if tx.snapshots.save(deleting, snap):
                tx.events.add(event)
    for snap in gone:
        finish_delete(deps, snap)
    return len(gone)


def settle_snapshots(deps: Deps) -> list[str]:
    """The sweep's part: the snapshots of closed tasks go; one being deleted when a
    crash came is deleted; one being made for longer than any save takes is
    abandoned, and its VM, if left stopped after the save, runs on from its file."""
    with deps.store.read() as tx:
        snaps = tx.snapshots.all()
        closed = {s.task_id for s in snaps
                  if (task := tx.tasks.get(s.task_id)) is None or not task.is_open}
    stale = deps.clock.now() - timedelta(seconds=deps.limits.creating_grace_s)
    settled: list[str] = []
    for snap in snaps:
        if snap.state == "deleting":
            finish_delete(deps, snap)
        elif snap.state == "making" and snap.created_at < stale:
            _settle_cut(deps, snap)
        elif snap.task_id in closed:
            remove_task_snapshots(deps, snap.task_id, SWEEP)
        else:
            continue
        settled.append(snap.id)
    return settled


def _settle_cut(deps: Deps, snap: Snapshot) -> None:
    with deps.store.read() as tx:
        vm = tx.vms.get(snap.vm_id)
        host = tx.hosts.get(snap.host)
    if vm is not None and vm.change == "snapshotting" and host is not None:
        hv = deps.hosts.hypervisor(host.uri)
        domain = next((d for d in hv.list_domains() if d.name == vm.domain_name), None)
        if domain is not None and not domain.active:
            try:
                hv.restore_state(state_path(deps, snap.id))
            except HypervisorError as exc:
                deps.log.warning("a vm cut mid-snapshot did not run on", extra={
                    "vm_id": vm.id, "error": str(exc)})
                return  # the next sweep tries again; reconciliation fails it in time
    deps.log.warning("snapshot cut by a crash abandoned", extra={"snapshot_id": snap.id})
    disk = host_disk(deps, snap.host)
    if vm is not None:
        _abandon(deps, snap, vm, disk)
    else:
        remove_files(deps, snap.id, disk)
        with deps.store.write() as tx:
            _remove_row(tx, snap.id, "making")
