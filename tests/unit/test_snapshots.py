"""Snapshots and forks (SPEC §12) against fakes: the rows and events, the quotas
and the host's room (all or none), the refusals, and what a crash leaves."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import reconcile, sweeps
from rift.services.context import Deps, GuestRuntime
from rift.services.lifecycle import pauses, snapshot_files, snapshots, tasks, vms
from rift.services.lifecycle.forks import fork
from tests.support.engine import ALICE, BOB, event_types, refused, snapshot


def _running(deps: Deps, **size: int) -> tuple[str, str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="tiny",
             **size)).vm
    return opened.task.id, str(opened.handle), vm.id


def test_a_snapshot_keeps_the_vm_running_and_is_listed_in_its_task(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    snap = snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id,
               name="clean")).snapshot
    assert snap.id.startswith("snap_") and (snap.vm_id, snap.name) == (vm_id, "clean")
    assert local_hv.domains[f"rift-{vm_id}"].active
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm.status == "running"
    task = tasks.get(deps, ALICE, command(c.TaskGetIn, handle=handle)).task
    assert [s.id for s in task.snapshots] == [snap.id]
    assert event_types(deps, task_id)[-1] == "snapshot_made"
    with deps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    assert vm is not None and vm.change is None


def test_forks_are_new_vms_of_the_task_that_start_as_forks_with_their_source_named(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    snap = snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id)).snapshot
    forks = fork(deps, ALICE, command(c.VmForkIn, handle=handle, snapshot_id=snap.id,
                name="try", count=3)).vms
    assert [f.name for f in forks] == ["try-1", "try-2", "try-3"]
    assert all(f.status == "running" and f.start and f.start.kind == "fork" for f in forks)
    assert len({f.id for f in forks} | {vm_id}) == 4
    assert {f"rift-{f.id}" for f in forks} < set(local_hv.domains)
    events = [e for e in tasks.events(deps, ALICE, command(c.TaskEventsIn, task_id=task_id,
                             after_id=0, limit=100)).events
              if e.type in ("vm_creating", "vm_running") and e.details["vm_id"] != vm_id]
    assert len(events) == 6
    assert all(e.details["from"] == {"snapshot_id": snap.id, "vm_id": vm_id} for e in events)


def test_a_fork_of_a_running_vm_snapshots_it_first_and_keeps_no_snapshot(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    forks = fork(deps, ALICE, command(c.VmForkIn, handle=handle, vm_id=vm_id)).vms
    assert len(forks) == 1 and forks[0].status == "running"
    assert tasks.get(deps, ALICE, command(c.TaskGetIn, handle=handle)).task.snapshots == []
    kinds = event_types(deps, task_id)
    assert kinds.count("snapshot_made") == kinds.count("snapshot_deleted") == 1


def test_a_fork_has_its_sources_egress(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    source = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", egress="none")).vm
    forks = fork(deps, ALICE, command(c.VmForkIn, handle=handle, vm_id=source.id,
                count=2)).vms
    assert [f.egress for f in forks] == ["none", "none"]


def test_a_fork_over_the_quota_or_the_room_is_refused_and_makes_none(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _running(deps, memory_mib=8192)
    snap = snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id)).snapshot
    before = snapshot(deps)
    over = refused("quota_exceeded", lambda: fork(deps, ALICE, command(c.VmForkIn,
                                         handle=handle, snapshot_id=snap.id,
                                         count=16)))  # 1 + 16 > RIFT_MAX_VMS_PER_TASK
    assert "rift_vm_destroy" in over.hint
    full = refused("no_capacity", lambda: fork(deps, ALICE, command(c.VmForkIn,
                                      handle=handle, snapshot_id=snap.id,
                                      count=4)))  # 5 x 8 GiB > the host's 32 GiB
    assert full.details["asked"] == {"vcpus": 4, "memory_mib": 4 * 8192}
    refused("no_capacity", lambda: fork(deps, ALICE, command(c.VmForkIn, handle=handle,
                               vm_id=vm_id, count=4)))
    assert snapshot(deps) == before
    assert len(fork(deps, ALICE, command(c.VmForkIn, handle=handle, snapshot_id=snap.id,
                   count=3)).vms) == 3


def test_a_snapshot_forks_into_another_open_task_of_its_user_only(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    source_task, handle, vm_id = _running(deps)
    snap = snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id)).snapshot
    other = tasks.new(deps, ALICE, command(c.TaskNewIn))
    forks = fork(deps, ALICE, command(c.VmForkIn, handle=str(other.handle),
                                      snapshot_id=snap.id, count=2)).vms
    assert {f.task_id for f in forks} == {other.task.id} != {source_task}
    assert all(f.status == "running" and f.start and f.start.kind == "fork" for f in forks)
    mine = tasks.get(deps, ALICE, command(c.TaskGetIn, handle=handle)).task
    assert [s.id for s in mine.snapshots] == [snap.id]  # the snapshot stays its task's
    bobs = tasks.new(deps, BOB, command(c.TaskNewIn))
    refused("snapshot_not_found", lambda: fork(deps, BOB, command(
        c.VmForkIn, handle=str(bobs.handle), snapshot_id=snap.id)))
    tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=handle))  # its snapshots go
    refused("snapshot_not_found", lambda: fork(deps, ALICE, command(
        c.VmForkIn, handle=str(other.handle), snapshot_id=snap.id)))


def test_the_snapshot_quota_holds_and_a_deleted_snapshot_is_gone(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    limited = replace(deps, limits=replace(deps.limits, max_snapshots_per_task=2))
    task_id, handle, vm_id = _running(limited)
    first = snapshots.make(limited, ALICE, command(c.VmSnapshotIn, handle=handle,
                vm_id=vm_id)).snapshot
    snapshots.make(limited, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id))
    before = snapshot(limited)
    error = refused("quota_exceeded", lambda: snapshots.make(limited, ALICE, command(c.VmSnapshotIn,
                                          handle=handle, vm_id=vm_id)))
    assert "rift_vm_snapshot_delete" in error.hint
    assert snapshot(limited) == before
    gone = snapshots.delete(limited, ALICE, command(c.VmSnapshotDeleteIn, handle=handle,
               snapshot_id=first.id)).snapshot
    assert gone.id == first.id
    assert event_types(limited, task_id)[-1] == "snapshot_deleted"
    refused("snapshot_not_found", lambda: snapshots.delete(limited, ALICE, command(
                                      c.VmSnapshotDeleteIn, handle=handle, snapshot_id=first.id)))
    refused("snapshot_not_found", lambda: fork(limited, ALICE, command(c.VmForkIn,
                                      handle=handle, snapshot_id=first.id)))
    assert snapshots.make(limited, ALICE, command(c.VmSnapshotIn, handle=handle,
               vm_id=vm_id)).snapshot.vm_id == vm_id


def test_snapshots_and_forks_refuse_what_is_not_the_callers(deps: Deps) -> None:
    _, handle, vm_id = _running(deps)
    snap = snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id)).snapshot
    other = tasks.new(deps, BOB, command(c.TaskNewIn))
    bob = str(other.handle)
    refused("vm_not_found", lambda: snapshots.make(deps, BOB, command(c.VmSnapshotIn, handle=bob,
                                vm_id=vm_id)))
    unknown = refused("snapshot_not_found", lambda: fork(deps, BOB, command(c.VmForkIn,
                                                handle=bob, snapshot_id=snap.id)))
    foreign = refused("snapshot_not_found", lambda: snapshots.delete(deps, BOB, command(
                                                c.VmSnapshotDeleteIn, handle=bob,
                                                snapshot_id=snap.id)))
    assert "rift_task_get" in unknown.hint and foreign.code == unknown.code
    refused("invalid_argument", lambda: fork(deps, ALICE, command(c.VmForkIn,
                                    handle=handle)))  # neither
    refused("invalid_argument", lambda: fork(deps, ALICE, command(c.VmForkIn,
                                    handle=handle, snapshot_id=snap.id, vm_id=vm_id)))  # both
    refused("invalid_argument", lambda: fork(deps, ALICE, command(c.VmForkIn,
                                    handle=handle, snapshot_id=snap.id, count=0)))
    refused("invalid_argument", lambda: snapshots.delete(deps, ALICE, command(c.VmSnapshotDeleteIn,
                                    handle=handle, snapshot_id="snap_NOPE")))
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    paused = refused("vm_not_running", lambda: snapshots.make(deps, ALICE, command(c.VmSnapshotIn,
                                           handle=handle, vm_id=vm_id)))
    assert "rift_vm_resume" in paused.hint


def test_a_snapshot_libvirt_cannot_save_leaves_the_vm_running_and_nothing_else(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _running(deps)
    before = snapshot(deps)
    local_hv.fail_next("save", "No space left on device")
    error = refused("hypervisor_error", lambda: snapshots.make(deps, ALICE, command(c.VmSnapshotIn,
                                            handle=handle, vm_id=vm_id)))
    assert "No space left" in error.message
    assert snapshot(deps) == before
    assert local_hv.domains[f"rift-{vm_id}"].active


def test_a_fork_libvirt_refuses_fails_that_fork_alone(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _running(deps)
    snap = snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id)).snapshot
    local_hv.fail_next("fork", "cannot restore")
    forks = fork(deps, ALICE, command(c.VmForkIn, handle=handle, snapshot_id=snap.id,
                count=2)).vms
    assert sorted(f.status for f in forks) == ["failed", "running"]
    failed = next(f for f in forks if f.status == "failed")
    assert "cannot restore" in (failed.error or "")
    assert f"rift-{failed.id}" not in local_hv.domains


def test_closing_the_task_deletes_its_snapshots_and_the_sweep_those_of_idle_tasks(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id))
    tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=handle))
    with deps.store.read() as tx:
        assert tx.snapshots.of_task(task_id) == []
    assert event_types(deps, task_id).count("snapshot_deleted") == 1
    idle_id, idle_handle, idle_vm = _running(deps)
    snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=idle_handle, vm_id=idle_vm))
    clock.advance(deps.lease_rules.task_idle_s + 1)
    report = sweeps.sweep(deps)
    assert idle_id in report.closed and report.snapshots_settled
    with deps.store.read() as tx:
        assert tx.snapshots.all() == []


def test_a_snapshot_cut_by_a_crash_after_the_save_is_abandoned_and_its_vm_runs_on(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    snap, vm, _uri = snapshots.begin(deps, ALICE, snapshots.parse_handle(handle), vm_id, None)
    local_hv.save_state(vm.domain_name, snapshot_files.state_path(deps, snap.id))  # then: kill -9
    assert not local_hv.domains[vm.domain_name].active
    assert not reconcile.reconcile(deps)  # reconciliation leaves a snapshot's VM to it
    assert not snapshots.settle_snapshots(deps)  # young: its call may finish it
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert snapshots.settle_snapshots(deps) == [snap.id]
    assert local_hv.domains[vm.domain_name].active
    with deps.store.read() as tx:
        assert tx.snapshots.all() == []
        current = tx.vms.get(vm_id)
    assert current is not None and (current.status, current.change) == ("running", None)
    assert "snapshot_made" not in event_types(deps, task_id)


def test_host_list_counts_paused_vms_and_snapshots_and_remove_refuses_them(
        deps: Deps) -> None:
    from rift.services.operator import hosts

    _, handle, vm_id = _running(deps)
    snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id))
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    (local,) = hosts.list_hosts(deps)
    assert (local["paused"], local["snapshots"], local["vms"]) == (1, 1, 0)
    assert "VMs" in refused("invalid_argument", hosts.remove_host, deps, "local").message
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm_id, handle=handle))
    assert "snapshots" in refused("invalid_argument", hosts.remove_host, deps,
                                  "local").message


def test_the_sweep_removes_snapshot_folders_without_a_row_and_forks_copies_a_crash_left(
        deps: Deps, tmp_path: Path) -> None:
    runtime = GuestRuntime(images_dir=tmp_path / "images", serial_dir=tmp_path / "serial",
                           boot_timeout_s=5, accel=lambda uri: "qemu")
    deps = replace(deps, runtime=runtime)
    _, handle, vm_id = _running(deps)
    snap = snapshots.make(deps, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm_id)).snapshot
    kept = runtime.snapshots_dir / snap.id
    kept.mkdir(parents=True, exist_ok=True)
    orphan = runtime.snapshots_dir / "snap_aaaaaaaa"
    orphan.mkdir()
    (orphan / "state").write_bytes(b"x")
    old, new = kept / ".fork-rift-vm_aaaaaaaa.save", kept / ".fork-rift-vm_bbbbbbbb.save"
    in_image = runtime.images_dir / "counting" / ".fork-rift-vm_cccccccc.save"
    in_image.parent.mkdir(parents=True)
    for path in (old, new, in_image):
        path.write_bytes(b"copy")
    long_ago = time.time() - deps.limits.creating_grace_s - 60
    for path in (old, in_image):
        os.utime(path, (long_ago, long_ago))
    gone = snapshot_files.dead_snapshot_files(deps)
    assert sorted(gone) == sorted(["snap_aaaaaaaa", old.name, in_image.name])
    assert not orphan.exists() and not old.exists() and not in_image.exists()
    assert new.exists() and kept.is_dir()  # a fork under way keeps its copy
