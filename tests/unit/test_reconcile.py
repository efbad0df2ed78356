"""Reconciliation against fakes: orphans go, vanished domains fail their rows,
destroys a crash cut short are finished."""

from __future__ import annotations

import time

import pytest

from hypervisor.fake import FakeHypervisor
from hypervisor.kvm import PROBE_STALE_S, PROBE_TASK
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.domain.model import Vm
from rift.services.background import reconcile, sweeps
from rift.services.context import Deps
from rift.services.lifecycle import tasks, teardown, vms
from tests.support.engine import ALICE, event_types


def test_a_domain_with_rift_metadata_and_no_live_row_is_destroyed(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    kept = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    local_hv.add_foreign_domain("rift-vm_zzzzzzzz", opened.task.id, "vm_zzzzzzzz")
    local_hv.add_foreign_domain("not-rifts", None, None)
    report = reconcile.reconcile(deps)
    assert report.orphans_destroyed == ["rift-vm_zzzzzzzz"]
    assert set(local_hv.domains) == {f"rift-{kept.id}", "not-rifts"}


def test_a_running_row_whose_domain_vanished_becomes_failed_with_an_event(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    del local_hv.domains[f"rift-{vm.id}"]  # virsh destroy behind Rift's back
    report = reconcile.reconcile(deps)
    assert report.vanished == [vm.id]
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm
    assert got.status == "failed" and "gone" in got.error
    assert event_types(deps, opened.task.id)[-1] == "vm_failed"
    assert not reconcile.reconcile(deps)  # a second pass finds nothing


def test_a_create_that_died_half_way_is_failed_after_the_grace_period(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    from rift.domain.model import NewEvent, Vm

    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    now = clock.now()
    stuck = Vm(id="vm_stuckaaa", task_id=opened.task.id, owner="alice", name="s",
               image="tiny", status="creating", host="local", vcpus=1, memory_mib=64,
               created_at=now)
    with deps.store.write() as tx:  # the row and its event, then the process died
        tx.vms.add(stuck)
        tx.events.add(NewEvent(stuck.task_id, "vm_creating", now, "mcp:x", {"vm_id": stuck.id}))
    local_hv.add_foreign_domain(stuck.domain_name, stuck.task_id, stuck.id)
    assert not reconcile.reconcile(deps).interrupted  # still within the grace period
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert reconcile.reconcile(deps).interrupted == [stuck.id]
    assert local_hv.domains == {}
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=stuck.id)).vm.status == "failed"


def test_an_unreachable_host_is_reported_and_the_rest_goes_on(
        deps: Deps, local_hv: FakeHypervisor, pool: object) -> None:
    from hypervisor.base import HypervisorError
    from rift.services.operator import hosts

    hosts.add_host(deps, "gone", "fake:///gone", hosts.HostSize(4, 4096))
    gone = deps.hosts.hypervisor("fake:///gone")

    def refuse() -> list[object]:
        raise HypervisorError("list", "unable to connect to server")

    gone.list_domains = refuse  # type: ignore[method-assign]
    local_hv.add_foreign_domain("rift-vm_orphanaa", "task_aaaaaaaa", "vm_orphanaa")
    report = reconcile.reconcile(deps)
    assert report.unreachable == ["gone"] and report.orphans_destroyed == ["rift-vm_orphanaa"]


def test_the_sweep_reconciles(deps: Deps, local_hv: FakeHypervisor) -> None:
    local_hv.add_foreign_domain("rift-vm_orphanbb", "task_aaaaaaaa", "vm_orphanbb")
    sweeps.sweep(deps)
    assert local_hv.domains == {}


def test_another_installations_domains_are_left_alone(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    local_hv.add_foreign_domain("rift-vm_theirsaa", "task_aaaaaaaa", "vm_theirsaa",
                                install="rift_someone_else")
    assert not reconcile.reconcile(deps).orphans_destroyed
    assert "rift-vm_theirsaa" in local_hv.domains


def test_an_unreachable_host_takes_no_new_vms_and_its_vms_say_why(
        deps: Deps, pool: object) -> None:
    from hypervisor.base import HypervisorError
    from rift.services.operator import hosts

    hosts.add_host(deps, "far", "fake:///far", hosts.HostSize(64, 1_000_000))  # most free memory
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    there = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    assert there.host == "far"
    far = deps.hosts.hypervisor("fake:///far")
    working = far.list_domains

    def refuse() -> list[object]:
        raise HypervisorError("list", "unable to connect to server: Connection refused")

    far.list_domains = refuse  # type: ignore[method-assign]
    reconcile.reconcile(deps)
    listed = {h["name"]: h for h in hosts.list_hosts(deps)}
    assert listed["far"]["state"] == "unreachable" and "refused" in listed["far"]["last_error"]
    marked = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=there.id)).vm
    assert marked.status == "running" and "does not answer" in marked.error
    assert vms.new(deps, ALICE, command(c.VmNewIn,
               handle=str(opened.handle))).vm.host == "local"  # not "far"
    far.list_domains = working  # type: ignore[method-assign]
    reconcile.reconcile(deps)
    assert {h["name"]: h for h in hosts.list_hosts(deps)}["far"]["state"] == "active"
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=there.id)).vm.error is None


def test_a_host_lost_past_its_grace_fails_its_vms_and_frees_them_and_coming_back_destroys_them(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor, pool: object) -> None:
    from hypervisor.base import HypervisorError
    from rift.services.lifecycle import pauses
    from rift.services.operator import hosts

    hosts.add_host(deps, "far", "fake:///far", hosts.HostSize(64, 1_000_000))  # most free memory
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    running, parked = (vms.new(deps, ALICE, command(c.VmNewIn,
                           handle=handle)).vm, vms.new(deps, ALICE, command(c.VmNewIn,
                                                            handle=handle)).vm)
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=parked.id))
    assert {running.host, parked.host} == {"far"}
    here = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
               vcpus=64)).vm  # too big for "far": on "local"
    far = deps.hosts.hypervisor("fake:///far")
    assert isinstance(far, FakeHypervisor)
    far.add_foreign_domain("rift-vm_theirsbb", "task_bbbbbbbb", "vm_theirsbb",
                           install="rift_someone_else")
    working = far.list_domains

    def refuse() -> list[object]:
        raise HypervisorError("list", "unable to connect to server: No route to host")

    far.list_domains = refuse  # type: ignore[method-assign]
    reconcile.reconcile(deps)
    clock.advance(deps.limits.host_lost_s - 1)
    assert reconcile.reconcile(deps).lost == []  # not yet: unreachable, VMs still theirs
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=running.id)).vm.status == "running"
    with deps.store.read() as tx:
        assert tx.fleet.usage_by_host()["far"].vcpus == 1
    clock.advance(2)
    report = reconcile.reconcile(deps)
    assert sorted(report.lost) == sorted([running.id, parked.id])
    for vm_id in (running.id, parked.id):
        got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
        assert got.status == "failed" and got.error.startswith("host lost: far"), got
    assert vms.get(deps, ALICE, command(c.VmGetIn,
               vm_id=here.id)).vm.status == "running"  # other hosts untouched
    assert event_types(deps, opened.task.id).count("vm_failed") == 2
    with deps.store.read() as tx:
        assert "far" not in tx.fleet.usage_by_host()  # its capacity is no longer held
    assert not reconcile.reconcile(deps).lost  # once
    # it comes back: the lost VMs' domains go, nothing else does
    far.list_domains = working  # type: ignore[method-assign]
    back = reconcile.reconcile(deps)
    assert sorted(back.orphans_destroyed) == sorted([f"rift-{running.id}", f"rift-{parked.id}"])
    assert set(far.domains) == {"rift-vm_theirsbb"}
    assert {h["name"]: h for h in hosts.list_hosts(deps)}["far"]["state"] == "active"
    assert vms.get(deps, ALICE, command(c.VmGetIn,
               vm_id=running.id)).vm.status == "failed"  # it stays failed


class Killed(Exception):
    """`kill -9` of the server: nothing after this point of a call happens."""


def _events(deps: Deps, task_id: str) -> list[tuple[str, str, dict[str, object]]]:
    with deps.store.read() as tx:
        return [(e.type, e.actor, e.details) for e in tx.events.page(task_id, 0, 1000)]


def _cut_after_the_domain(monkeypatch: pytest.MonkeyPatch, stop: bool = False) -> None:
    """The next destroy dies once libvirt answered and before its row is marked:
    the domain is gone (or, with `stop`, shut off but still defined)."""
    real = teardown.destroy_domain

    def cut(deps: Deps, vm: Vm, uri: str | None) -> None:
        monkeypatch.setattr(teardown, "destroy_domain", real)
        if stop:
            assert uri is not None
            hv = deps.hosts.hypervisor(uri)
            assert isinstance(hv, FakeHypervisor)
            hv.domains[vm.domain_name].active = False
        else:
            real(deps, vm, uri)
        raise Killed

    monkeypatch.setattr(teardown, "destroy_domain", cut)


@pytest.mark.parametrize("stop", [False, True], ids=["domain gone", "domain shut off"])
def test_a_destroy_a_crash_cut_after_libvirt_is_finished_as_a_destroy(
        deps: Deps, local_hv: FakeHypervisor, monkeypatch: pytest.MonkeyPatch,
        stop: bool) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    task_id, handle = opened.task.id, str(opened.handle)
    doomed = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    kept = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    _cut_after_the_domain(monkeypatch, stop)
    with pytest.raises(Killed):
        vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=doomed.id, handle=handle))
    at_kill = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=doomed.id)).vm
    assert at_kill.status == "running"  # the row was never marked
    assert set(at_kill.model_dump()) == set(kept.model_dump())  # the view is unchanged
    report = reconcile.reconcile(deps)  # the restart's pass
    assert report.destroys_finished == [doomed.id]
    assert not report.vanished and not report.stopped
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=doomed.id)).vm
    assert got.status == "destroyed" and got.destroyed_at is not None
    assert got.error is None
    assert set(local_hv.domains) == {f"rift-{kept.id}"}
    told = _events(deps, task_id)
    assert [kind for kind, _, _ in told].count("vm_destroyed") == 1
    assert "vm_failed" not in [kind for kind, _, _ in told]
    assert told[-1] == ("vm_destroyed", "sweep",
                        {"vm_id": doomed.id, "host": "local", **reconcile.FINISHED_DESTROY})
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=kept.id)).vm.status == "running"
    assert not reconcile.reconcile(deps)  # a second pass finds nothing
    assert vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=doomed.id,
               handle=handle)).vm.status == "destroyed"
    assert [kind for kind, _, _ in _events(deps, task_id)].count("vm_destroyed") == 1


def test_a_destroy_libvirt_refused_is_finished_by_a_later_sweep(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    from rift.domain.errors import RiftError

    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    local_hv.fail_destroy("internal error: busy")
    with pytest.raises(RiftError):
        vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm.id, handle=str(opened.handle)))
    assert not reconcile.reconcile(deps).destroys_finished  # still refused: stays running
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.status == "running"
    local_hv.fail_destroy(None)
    assert reconcile.reconcile(deps).destroys_finished == [vm.id]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.status == "destroyed"
    assert local_hv.domains == {}
    assert event_types(deps, opened.task.id).count("vm_destroyed") == 1


def test_a_creating_row_whose_destroy_was_cut_is_destroyed_after_the_grace(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    stuck = Vm(id="vm_stuckbbb", task_id=opened.task.id, owner="alice", name="s",
               image="tiny", status="creating", host="local", vcpus=1, memory_mib=64,
               created_at=clock.now())
    with deps.store.write() as tx:
        tx.vms.add(stuck)
    local_hv.add_foreign_domain(stuck.domain_name, stuck.task_id, stuck.id)
    assert teardown.request_destroy(deps, stuck)  # then the process died
    assert not reconcile.reconcile(deps)  # within the grace: a create may be under way
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert reconcile.reconcile(deps).destroys_finished == [stuck.id]
    assert local_hv.domains == {}
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=stuck.id)).vm.status == "destroyed"
    assert event_types(deps, stuck.task_id) == ["opened", "vm_destroyed"]


def test_a_sweep_racing_a_live_destroy_makes_one_event(
        deps: Deps, local_hv: FakeHypervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep runs while `rift_vm_destroy` is between libvirt and its row: one of
    the two marks the row, with one `vm_destroyed`, and no one fails it."""
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    real = teardown.destroy_domain
    swept: list[reconcile.ReconcileReport] = []

    def with_a_sweep_meanwhile(deps_: Deps, vm_: Vm, uri: str | None) -> None:
        real(deps_, vm_, uri)
        monkeypatch.setattr(teardown, "destroy_domain", real)  # the sweep's own destroy
        swept.append(reconcile.reconcile(deps_))

    monkeypatch.setattr(teardown, "destroy_domain", with_a_sweep_meanwhile)
    gone = vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm.id,
               handle=str(opened.handle))).vm
    assert gone.status == "destroyed"
    assert swept[0].destroys_finished == [vm.id] and not swept[0].vanished
    assert event_types(deps, opened.task.id).count("vm_destroyed") == 1
    assert "vm_failed" not in event_types(deps, opened.task.id)


def test_a_row_whose_destroy_was_asked_after_it_was_read_is_not_failed(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    """Reconciliation read the row before the destroy asked for it, and the listing
    then missed the domain that destroy took down: the row is not blamed."""
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    made = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.read() as tx:
        read_before = tx.vms.get(made.id)
    assert read_before is not None
    assert teardown.request_destroy(deps, read_before)
    del local_hv.domains[read_before.domain_name]
    assert not reconcile._fail(deps, read_before, "running", "the domain is gone")
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=made.id)).vm.status == "running"
    assert reconcile.reconcile(deps).destroys_finished == [made.id]
    assert event_types(deps, opened.task.id)[-1] == "vm_destroyed"


def test_a_kvm_probe_guest_left_behind_is_destroyed_and_one_under_way_kept(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    now = int(time.time())
    left = f"probe-{now - PROBE_STALE_S - 60}-0badc0de"
    running = f"probe-{now - 2}-600dc0de"
    for probe_id in (left, running):
        local_hv.add_foreign_domain(f"rift-{probe_id}", PROBE_TASK, probe_id)
    report = reconcile.reconcile(deps)
    assert report.orphans_destroyed == [f"rift-{left}"]
    assert set(local_hv.domains) == {f"rift-{running}"}
