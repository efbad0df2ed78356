"""`rift host drain NAME --move` over fake hypervisors (live migration between them)
on a real SQLite store: the rows follow their domains, with their events; nothing
moves when one VM has nowhere to go; a failed migration leaves its VM in place."""

from __future__ import annotations

import pytest

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.errors import NoCapacity
from rift.services.context import Deps
from rift.services.lifecycle import pauses, tasks, vms
from rift.services.operator import hosts
from rift.services.operator.hosts import HostSize
from rift.services.operator.moves import drain_and_move
from tests.support.engine import ALICE, FakePool, event_types, snapshot


def _on_far(deps: Deps, pool: FakePool, count: int) -> tuple[str, list[str]]:
    hosts.add_host(deps, "far", "fake:///far", HostSize(64, 1_000_000))  # the most free memory
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    made = [vms.new(deps, ALICE, command(c.VmNewIn,
                handle=str(opened.handle))).vm.id for _ in range(count)]
    assert {vms.get(deps, ALICE, command(c.VmGetIn,
                vm_id=vm_id)).vm.host for vm_id in made} == {"far"}
    return str(opened.handle), made


def test_drain_move_moves_each_running_vm_with_its_event_and_leaves_a_paused_one(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor) -> None:
    handle, (one, two, parked) = _on_far(deps, pool, 3)
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=parked))
    far = pool.hypervisor("fake:///far")
    report = drain_and_move(deps, "far")
    assert sorted(report.moved) == sorted([(one, "local"), (two, "local")])
    assert report.stayed == [(parked, "paused: only running VMs move")] and not report.failed
    for vm_id in (one, two):
        moved = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
        assert moved.host == "local" and moved.status == "running"
        assert f"rift-{vm_id}" in local_hv.domains and f"rift-{vm_id}" not in far.domains
    task_id = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=one)).vm.task_id
    assert event_types(deps, task_id).count("vm_moved") == 2
    listed = {h["name"]: h for h in hosts.list_hosts(deps)}
    assert listed["far"]["state"] == "drained" and listed["far"]["vms"] == 0


def test_nothing_moves_when_one_vm_has_nowhere_to_go(deps: Deps, pool: FakePool) -> None:
    hosts.add_host(deps, "far", "fake:///far", HostSize(64, 1_000_000))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    big = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), vcpus=64,
              memory_mib=60_000)).vm
    assert big.host == "far"
    before = snapshot(deps)
    with pytest.raises(NoCapacity):
        drain_and_move(deps, "far")
    assert snapshot(deps) == before  # not even drained
    assert {h["name"]: h for h in hosts.list_hosts(deps)}["far"]["state"] == "active"


def test_a_migration_that_fails_leaves_its_vm_running_where_it_was(
        deps: Deps, pool: FakePool) -> None:
    _handle, (first, second) = _on_far(deps, pool, 2)
    pool.hypervisor("fake:///far").fail_next("migrate", "migration job: unexpectedly failed")
    report = drain_and_move(deps, "far")
    assert len(report.failed) == 1 and "unexpectedly failed" in report.failed[0][1]
    stuck = report.failed[0][0]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=stuck)).vm.host == "far"
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=stuck)).vm.status == "running"
    assert f"rift-{stuck}" in pool.hypervisor("fake:///far").domains
    assert len(report.moved) == 1 and {stuck, report.moved[0][0]} == {first, second}


def test_removing_a_host_with_vms_names_drain_move(deps: Deps, pool: FakePool) -> None:
    from tests.support.engine import refused

    _on_far(deps, pool, 1)
    err = refused("invalid_argument", hosts.remove_host, deps, "far")
    assert "rift host drain far --move" in err.message
