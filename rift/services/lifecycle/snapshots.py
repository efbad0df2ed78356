"""Snapshots and forks (SPEC §12): a VM's memory and disk kept as of one moment,
and new VMs started from them.

A snapshot saves the running VM to a file (libvirt's virDomainSave: the domain
stops), copies its overlay beside it while it is stopped, and restores the VM
from the same file at once: the VM goes on where it was, after a pause of about
a restore's length. Its files live on the VM's host, in `snapshots/<id>/`
(`state`, and `disk.qcow2` for images with a disk). The row is `making` before
libvirt is asked (with the VM's `change` `snapshotting`), `ready` after, and
`deleting` while its files go; a crash in between is settled by the sweep
(`settle_snapshots`): a cut snapshot's files go, and a VM left stopped after its
save runs again from the file.

A fork is a new domain started from a snapshot's file under its own name, UUID,
disk, serial log and SSH port (`Hypervisor.fork_state`: libvirt restores a save
file only under the name and UUID in its header, so each fork gets a copy of
the file with its own XML, see hypervisor/save_image.py). Its disk is a copy of
the snapshot's; once it answers, the guest gets an identity of its own
(`GuestShell.forked`: a new SSH host key, MAC, entropy reseeded, clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from hypervisor.base import DomainSpec, HypervisorError, ImageError
from hypervisor.host_disk import LOCAL_DISK, HostDisk
from hypervisor.save_image import FORK_PREFIX
from rift.contract.snapshots import SnapshotOut, VmForkIn, VmSnapshotDeleteIn, VmSnapshotIn, VmsOut
from rift.domain import egress as egress_rules
from rift.domain.errors import (
    GuestUnreachable,
    HypervisorFailed,
    InvalidArgument,
    NoCapacity,
    QuotaExceeded,
    SnapshotNotFound,
    VmNotRunning,
)
from rift.domain.ids import new_snapshot_id, new_vm_id
from rift.domain.model import NewEvent, Task, Vm
from rift.domain.records import Snapshot, SnapshotState
from rift.domain.secrets import Handle
from rift.services.context import SWEEP, Caller, Deps
from rift.services.lifecycle.capacity import host_loads, room
from rift.services.lifecycle.disk_budget import check_disk_budget, check_host_disk
from rift.services.lifecycle.guest_kinds import GuestKind, kind_on, mac_of, vm_files
from rift.services.lifecycle.launch import SSH_HOST, Start, fail_start, pick_ssh_port, running
from rift.services.lifecycle.leases import check_handle, in_write, parse_handle, task_vm
from rift.services.lifecycle.teardown import destroy_domain
from rift.services.ports import Tx
from rift.services.read import views

STATE_FILE = "state"
DISK_FILE = "disk.qcow2"


# -- files ---------------------------------------------------------------------------------

def snapshot_dir(deps: Deps, snapshot_id: str) -> Path | None:
    """Where the snapshot's files are; None without a guest runtime (engine tests)."""
    return deps.runtime.snapshot_folder(snapshot_id)


def state_path(deps: Deps, snapshot_id: str) -> str:
    folder = snapshot_dir(deps, snapshot_id)
    return str(folder / STATE_FILE) if folder is not None else f"memory:{snapshot_id}"


def _disk(deps: Deps, host_name: str) -> HostDisk:
    """The files of the host a snapshot is on (its VM's): they are kept there."""
    with deps.store.read() as tx:
        host = tx.hosts.get(host_name)
    return deps.hosts.hypervisor(host.uri).disk if host is not None else LOCAL_DISK


def _remove_files(deps: Deps, snapshot_id: str, disk: HostDisk) -> None:
    folder = snapshot_dir(deps, snapshot_id)
    if folder is not None:
        try:
            disk.remove(str(folder))
        except OSError as exc:  # a host that does not answer: its files stay there
            deps.log.warning("a snapshot's files could not be removed", extra={
                "snapshot_id": snapshot_id, "error": str(exc)})


# -- snapshot -----------------------------------------------------------------------------

def make(deps: Deps, caller: Caller, cmd: VmSnapshotIn) -> SnapshotOut:
    """`rift_vm_snapshot`: snapshot a running VM of the handle's task; it runs on after."""
    parsed = parse_handle(cmd.handle)
    snap, vm, uri = _begin(deps, caller, parsed, cmd.vm_id, cmd.name)
    return SnapshotOut(snapshot=views.snapshot(_take(deps, caller, snap, vm, uri)))


def _begin(deps: Deps, caller: Caller, parsed: Handle, vm_id: str,
           name: str | None) -> tuple[Snapshot, Vm, str]:
    snapshot_id = new_snapshot_id()

    def begin(tx: Tx) -> tuple[Snapshot, Vm, str]:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        vm = _task_vm(tx, task, vm_id)
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

    return in_write(deps.store, begin)


def _task_vm(tx: Tx, task: Task, vm_id: str) -> Vm:
    """The task's running VM (leases.task_vm), not one whose destroy is under way."""
    vm = task_vm(tx, task, vm_id)
    if vm.destroy_requested_at:
        raise VmNotRunning(vm_id, vm.status)
    return vm


def _take(deps: Deps, caller: Caller, snap: Snapshot, vm: Vm, uri: str) -> Snapshot:
    """Save the VM to the snapshot's file, copy its disk, and run it on from the file."""
    hv = deps.hosts.hypervisor(uri)
    folder = snapshot_dir(deps, snap.id)
    state = state_path(deps, snap.id)
    host_key = deps.guests.keys.host_key(vm.id)
    steps = Steps()
    try:
        if folder is not None:
            hv.disk.make_dir(str(folder))
        deps.guests.lifecycle.drop_connections(vm.id)
        hv.save_state(vm.domain_name, state)
        steps.done("save")
    except (HypervisorError, OSError) as exc:
        _abandon(deps, snap, vm, hv.disk)
        raise HypervisorFailed(f"the snapshot could not be saved: {exc}", host=vm.host) from exc
    failure: Exception | None = None
    overlay = vm_files(deps).overlay_path(vm.id)
    size = 0
    try:
        if overlay is not None and folder is not None and hv.disk.is_file(str(overlay)):
            hv.disk.copy_sparse(str(overlay), str(folder / DISK_FILE))
            steps.done("disk")
        size = hv.disk.usage(str(folder)) if folder is not None else 0
    except OSError as exc:
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
    _remove_files(deps, snap.id, disk)
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
    _finish_delete(deps, snap)
    return SnapshotOut(snapshot=views.snapshot(snap))


def _finish_delete(deps: Deps, snap: Snapshot) -> None:
    _remove_files(deps, snap.id, _disk(deps, snap.host))
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
        _finish_delete(deps, snap)
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
            _finish_delete(deps, snap)
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
    disk = _disk(deps, snap.host)
    if vm is not None:
        _abandon(deps, snap, vm, disk)
    else:
        _remove_files(deps, snap.id, disk)
        with deps.store.write() as tx:
            _remove_row(tx, snap.id, "making")


def dead_snapshot_files(deps: Deps) -> list[str]:
    """Folders under `snapshots/` that no row names (a crash between the folder and
    the row, or a row purged), and forks' copies of a saved state (in a snapshot's
    folder or a snapshot image's) that a crash left behind, older than the grace
    a start has: they go. Answers the snapshot ids and file names removed."""
    kept = deps.runtime.kept_folders()  # (snapshots, images); none without real guests
    if not kept:
        return []
    gone: list[str] = []
    snapshots_dir = kept[0]
    found = [p.name for p in snapshots_dir.iterdir() if p.is_dir()] if snapshots_dir.is_dir() \
        else []
    with deps.store.read() as tx:
        dead = [name for name in found if tx.snapshots.get(name) is None]
    for name in dead:
        _remove_files(deps, name, LOCAL_DISK)
        gone.append(name)
    cutoff = time.time() - deps.limits.creating_grace_s  # files: the wall clock
    for folder in kept:
        for copy in folder.glob(f"*/{FORK_PREFIX}*"):
            with suppress(OSError):
                if copy.stat().st_mtime < cutoff:
                    copy.unlink()
                    gone.append(copy.name)
    return gone


# -- fork -----------------------------------------------------------------------------------

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
        snap, vm, uri = _begin(deps, caller, parsed, vm_id, f"fork of {vm_id}")
        snap = _take(deps, caller, snap, vm, uri)
        try:
            return _fork(deps, caller, cmd, snap, called)
        finally:
            deleting, event = snap.deleting(caller.label, deps.clock.now(),
                                            "the fork started")
            with deps.store.write() as tx:
                if tx.snapshots.save(deleting, snap):
                    tx.events.add(event)
            _finish_delete(deps, snap)
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
        vm = _task_vm(tx, task, vm_id)
        _check_quota_and_room(deps, tx, task, vm, count)

    in_write(deps.store, check)


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
        current = tx.snapshots.get(snap.id)
        if current is None or current.task_id != task.id or current.state != "ready":
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

    _all_at_once([lambda vm=vm: start(vm) for vm in vms])  # type: ignore[misc]
    return VmsOut(vms=[views.vm_of(answers.get(vm.id, vm)) for vm in vms])


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
        hv.fork_state(state_path(deps, snap.id), spec)
        steps.done("restore")
    except (HypervisorError, ImageError, HypervisorFailed, OSError) as exc:
        kind.clean_up(vm.id)
        return fail_start(deps, caller, vm, f"the fork could not start: {exc}")
    if vm.ssh_port is not None:
        timeout_s = deps.runtime.boot_timeout_s
        try:
            deps.guests.lifecycle.forked(vm, snap.host_key, mac_of(vm.id), timeout_s)
        except GuestUnreachable as exc:
            with suppress(HypervisorFailed):  # else reconciliation takes the domain down
                destroy_domain(deps, vm, uri)
            return fail_start(deps, caller, vm, f"the fork did not answer: {exc.message}")
        steps.done("identity")
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
