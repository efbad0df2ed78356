"""Reconciliation against fakes: orphans go, vanished domains fail their rows."""

from __future__ import annotations

from hypervisor.fake import FakeHypervisor
from rift.domain.clock import FakeClock
from rift.services import reconcile, sweeps, tasks, vms
from rift.services.context import Deps
from tests.conftest import ALICE
from tests.unit.helpers import event_types


def test_a_domain_with_rift_metadata_and_no_live_row_is_destroyed(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    opened = tasks.new_task(deps, ALICE)
    kept = vms.new_vm(deps, ALICE, str(opened.handle))
    local_hv.add_foreign_domain("rift-vm_zzzzzzzz", opened.task["id"], "vm_zzzzzzzz")
    local_hv.add_foreign_domain("not-rifts", None, None)
    report = reconcile.reconcile(deps)
    assert report.orphans_destroyed == ["rift-vm_zzzzzzzz"]
    assert set(local_hv.domains) == {f"rift-{kept['id']}", "not-rifts"}


def test_a_running_row_whose_domain_vanished_becomes_failed_with_an_event(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    opened = tasks.new_task(deps, ALICE)
    vm = vms.new_vm(deps, ALICE, str(opened.handle))
    del local_hv.domains[f"rift-{vm['id']}"]  # virsh destroy behind Rift's back
    report = reconcile.reconcile(deps)
    assert report.vanished == [vm["id"]]
    got = vms.get_vm(deps, ALICE, vm["id"])
    assert got["status"] == "failed" and "gone" in got["error"]
    assert event_types(deps, opened.task["id"])[-1] == "vm_failed"
    assert not reconcile.reconcile(deps)  # a second pass finds nothing


def test_a_create_that_died_half_way_is_failed_after_the_grace_period(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    from rift.domain.model import NewEvent, Vm

    opened = tasks.new_task(deps, ALICE)
    now = clock.now()
    stuck = Vm(id="vm_stuckaaa", task_id=opened.task["id"], owner="alice", name="s",
               image="tiny", status="creating", host="local", vcpus=1, memory_mib=64,
               created_at=now)
    with deps.store.write() as tx:  # the row and its event, then the process died
        tx.insert_vm(stuck)
        tx.add_event(NewEvent(stuck.task_id, "vm_creating", now, "mcp:x", {"vm_id": stuck.id}))
    local_hv.add_foreign_domain(stuck.domain_name, stuck.task_id, stuck.id)
    assert not reconcile.reconcile(deps).interrupted  # still within the grace period
    clock.advance(reconcile.CREATING_GRACE_S + 1)
    assert reconcile.reconcile(deps).interrupted == [stuck.id]
    assert local_hv.domains == {}
    assert vms.get_vm(deps, ALICE, stuck.id)["status"] == "failed"


def test_an_unreachable_host_is_reported_and_the_rest_goes_on(
        deps: Deps, local_hv: FakeHypervisor, pool: object) -> None:
    from hypervisor.base import HypervisorError
    from rift.services import hosts

    hosts.add_host(deps, "gone", "fake:///gone", 4, 4096)
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
    from rift.services import hosts

    hosts.add_host(deps, "far", "fake:///far", 64, 1_000_000)  # the most free memory
    opened = tasks.new_task(deps, ALICE)
    there = vms.new_vm(deps, ALICE, str(opened.handle))
    assert there["host"] == "far"
    far = deps.hosts.hypervisor("fake:///far")
    working = far.list_domains

    def refuse() -> list[object]:
        raise HypervisorError("list", "unable to connect to server: Connection refused")

    far.list_domains = refuse  # type: ignore[method-assign]
    reconcile.reconcile(deps)
    listed = {h["name"]: h for h in hosts.list_hosts(deps)}
    assert listed["far"]["state"] == "unreachable" and "refused" in listed["far"]["last_error"]
    marked = vms.get_vm(deps, ALICE, there["id"])
    assert marked["status"] == "running" and "does not answer" in marked["error"]
    assert vms.new_vm(deps, ALICE, str(opened.handle))["host"] == "local"  # not "far"
    far.list_domains = working  # type: ignore[method-assign]
    reconcile.reconcile(deps)
    assert {h["name"]: h for h in hosts.list_hosts(deps)}["far"]["state"] == "active"
    assert vms.get_vm(deps, ALICE, there["id"])["error"] is None
