"""Pause and resume (SPEC §12) against fakes: the statuses and events, the room a
paused VM gives back, the refusals, and the changes a crash cut short."""

from __future__ import annotations

import threading
from dataclasses import replace

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import reconcile
from rift.services.context import Deps
from rift.services.lifecycle import execs, pauses, tasks, vms
from tests.support.engine import ALICE, BOB, event_types, refused, snapshot
from tests.support.vm_rows import leave_cut_change


def _running(deps: Deps, **size: int) -> tuple[str, str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="tiny",
             **size)).vm
    return opened.task.id, str(opened.handle), vm.id


def test_a_paused_vm_is_saved_and_a_resumed_one_runs_again_with_their_events(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    paused = pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id)).vm
    assert paused.status == "paused" and paused.ssh is None
    domain = local_hv.domains[f"rift-{vm_id}"]
    assert (domain.active, domain.saved) == (False, True)
    resumed = pauses.resume(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id)).vm
    assert resumed.status == "running"
    assert (domain.active, domain.saved) == (True, False)
    assert event_types(deps, task_id)[-2:] == ["vm_paused", "vm_resumed"]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm == resumed


def test_pausing_a_paused_vm_or_resuming_a_running_one_answers_it_and_changes_nothing(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    before = snapshot(deps)
    assert pauses.resume(deps, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm_id)).vm.status == "running"
    assert snapshot(deps) == before
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    before = snapshot(deps)
    assert pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm_id)).vm.status == "paused"
    assert snapshot(deps) == before
    assert event_types(deps, task_id).count("vm_paused") == 1


def test_a_paused_vm_gives_its_room_back_and_resumes_only_when_there_is_room(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _running(deps, memory_mib=30000)  # most of the host's 32 GiB
    other = tasks.new(deps, BOB, command(c.TaskNewIn))
    refused("no_capacity", lambda: vms.new(deps, BOB, command(c.VmNewIn, handle=str(other.handle),
                               memory_mib=4096)))
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    taker = vms.new(deps, BOB, command(c.VmNewIn, handle=str(other.handle),
                memory_mib=4096)).vm  # the room it gave back
    assert taker.status == "running"
    before = snapshot(deps)
    full = refused("no_capacity", lambda: pauses.resume(deps, ALICE, command(c.VmHeldIn,
                                      handle=handle, vm_id=vm_id)))
    assert full.details["asked"] == {"vcpus": 1, "memory_mib": 30000}
    assert snapshot(deps) == before  # still paused, with no change under way
    vms.destroy(deps, BOB, command(c.VmDestroyIn, vm_id=taker.id, handle=str(other.handle)))
    assert pauses.resume(deps, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm_id)).vm.status == "running"


def test_a_paused_vm_refuses_guest_calls_naming_resume_and_still_counts_for_its_task(
        deps: Deps) -> None:
    task_id, handle, vm_id = _running(deps)
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    error = refused("vm_not_running", lambda: execs.start(deps, ALICE, command(c.VmExecIn,
                                          handle=handle, vm_id=vm_id, command="true")))
    assert "paused" in error.message and "rift_vm_resume" in error.hint
    limited = replace(deps, limits=replace(deps.limits, max_vms_per_task=1))
    refused("quota_exceeded", lambda: vms.new(limited, ALICE, command(c.VmNewIn, handle=handle,
                                  image="tiny")))
    closed = tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=handle))
    assert closed.destroyed == [vm_id]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm.status == "destroyed"
    assert event_types(deps, task_id)[-1] == "vm_destroyed"


def test_pause_and_resume_refuse_what_they_cannot_change(deps: Deps) -> None:
    _, handle, vm_id = _running(deps)
    other = tasks.new(deps, BOB, command(c.TaskNewIn))
    refused("vm_not_found", lambda: pauses.pause(deps, BOB, command(c.VmHeldIn,
                                handle=str(other.handle), vm_id=vm_id)))
    refused("vm_not_found", lambda: pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle,
                                vm_id="vm_zzzzzzzz")))
    refused("invalid_argument", lambda: pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle,
                                    vm_id="nope")))
    refused("handle_required", lambda: pauses.resume(deps, ALICE, command(c.VmHeldIn, handle=None,
                                   vm_id=vm_id)))
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm_id, handle=handle))
    gone = refused("vm_not_running", lambda: pauses.pause(deps, ALICE, command(c.VmHeldIn,
                                         handle=handle, vm_id=vm_id)))
    assert "destroyed" in gone.message and "rift_vm_new" in gone.hint


def test_a_pause_libvirt_refuses_leaves_the_vm_running_with_no_change(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    local_hv.fail_next("save", "disk full")
    error = refused("hypervisor_error", lambda: pauses.pause(deps, ALICE, command(c.VmHeldIn,
                                            handle=handle, vm_id=vm_id)))
    assert "disk full" in error.message
    with deps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    assert vm is not None and (vm.status, vm.change) == ("running", None)
    assert "vm_paused" not in event_types(deps, task_id)
    assert pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm_id)).vm.status == "paused"  # and again works


def test_a_second_pause_waits_for_the_first_and_one_event_is_written(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    saving = threading.Event()
    go_on = threading.Event()
    real_save = local_hv.save

    def slow_save(name: str) -> None:
        saving.set()
        go_on.wait(5)
        real_save(name)

    local_hv.save = slow_save  # type: ignore[method-assign]
    answers: list[str] = []
    first = threading.Thread(target=lambda: answers.append(
        pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id)).vm.status))
    first.start()
    assert saving.wait(5)
    second = threading.Thread(target=lambda: answers.append(
        pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id)).vm.status))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting on the first, not answering `running`
    go_on.set()
    first.join(5)
    second.join(5)
    assert answers == ["paused", "paused"]
    assert event_types(deps, task_id).count("vm_paused") == 1


def _cut(deps: Deps, vm_id: str, status: str, change: str, clock: FakeClock) -> None:
    """What a crash between the row's change and its end leaves."""
    with deps.store.write() as tx:
        leave_cut_change(tx, vm_id, status, change, clock.now())


def test_a_pause_cut_after_libvirt_saved_is_finished_by_reconciliation(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    _cut(deps, vm_id, "running", "pausing", clock)
    local_hv.save(f"rift-{vm_id}")
    assert not reconcile.reconcile(deps).changes_settled  # young: its call may settle it
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert reconcile.reconcile(deps).changes_settled == [vm_id]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm.status == "paused"
    assert event_types(deps, task_id)[-1] == "vm_paused"
    assert not reconcile.reconcile(deps)
    assert pauses.resume(deps, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm_id)).vm.status == "running"


def test_a_pause_cut_before_libvirt_saved_is_rolled_back_and_the_vm_runs_on(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    task_id, _handle, vm_id = _running(deps)
    _cut(deps, vm_id, "running", "pausing", clock)
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert reconcile.reconcile(deps).changes_settled == [vm_id]
    with deps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    assert vm is not None and (vm.status, vm.change) == ("running", None)
    assert "vm_paused" not in event_types(deps, task_id)


def test_a_resume_cut_either_side_of_libvirt_is_settled_by_what_the_host_shows(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _running(deps)
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    _cut(deps, vm_id, "paused", "resuming", clock)  # cut before the restore
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert reconcile.reconcile(deps).changes_settled == [vm_id]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm.status == "paused"
    _cut(deps, vm_id, "paused", "resuming", clock)  # cut after the restore
    local_hv.restore(f"rift-{vm_id}")
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert reconcile.reconcile(deps).changes_settled == [vm_id]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm.status == "running"
    assert event_types(deps, task_id)[-1] == "vm_resumed"


def test_a_paused_vm_whose_saved_state_or_domain_went_fails_and_nothing_is_left(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _running(deps)
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    local_hv.domains[f"rift-{vm_id}"].saved = False  # virsh managedsave-remove
    assert reconcile.reconcile(deps).vanished == [vm_id]
    failed = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert failed.status == "failed" and "saved state" in (failed.error or "")
    assert local_hv.domains == {}
    _, handle2, vm2 = _running(deps)
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle2, vm_id=vm2))
    del local_hv.domains[f"rift-{vm2}"]
    assert reconcile.reconcile(deps).vanished == [vm2]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm2)).vm.status == "failed"
    assert not reconcile.reconcile(deps)


def test_a_pause_between_the_sweeps_read_and_its_listing_keeps_its_domain(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    """The sweep read the row running, then a pause stopped the domain with its state
    saved before the listing: the row is not failed and the domain not taken down, so
    the resume finds it (a fresh-clone CI once answered `Domain not found` there)."""
    task_id, handle, vm_id = _running(deps)
    listing = local_hv.list_domains

    def paused_then_listed() -> list:  # type: ignore[type-arg]
        pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
        return listing()

    local_hv.list_domains = paused_then_listed  # type: ignore[method-assign]
    report = reconcile.reconcile(deps)
    local_hv.list_domains = listing  # type: ignore[method-assign]
    assert not report.stopped and not report.vanished, report
    assert (local_hv.domains[f"rift-{vm_id}"].saved, vms.get(deps, ALICE, command(c.VmGetIn,
                                                         vm_id=vm_id)).vm.status) \
        == (True, "paused")
    assert pauses.resume(deps, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm_id)).vm.status == "running"
    assert "vm_failed" not in event_types(deps, task_id)
