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


def test_a_vm_holding_volumes_moves_with_them_and_their_readers_move_together(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor) -> None:
    """Volumes' files are on this machine (fake hosts: both here): the VMs sharing a
    volume go to one host, the volumes' rows name it, the attachments stay; a VM
    sharing one with a VM that stays (paused) stays too, saying why; a volume no VM
    holds goes to the first host taking VMs."""
    from dataclasses import replace

    from rift.services.lifecycle import volumes
    from tests.support.volumes import Files, Mounts, attach, new_vm, new_volume

    vdeps = replace(deps, volume_files=Files(), mounts=Mounts())
    hosts.add_host(vdeps, "far", "fake:///far", HostSize(64, 1_000_000))
    _, handle, writer = new_vm(vdeps)
    _, handle_r, reader = new_vm(vdeps)
    _, handle_p, parked = new_vm(vdeps)
    work, shared, held, spare = (new_volume(vdeps, n) for n in ("work", "shared", "held",
                                                                 "spare"))
    assert {volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=v)).volume.host
            for v in (work, shared, held, spare)} == {"far"}
    attach(vdeps, handle, writer, work, "/work")
    attach(vdeps, handle, writer, shared, "/shared", read_only=True)
    attach(vdeps, handle_r, reader, shared, "/shared", read_only=True)
    attach(vdeps, handle_p, parked, held, "/held", read_only=True)
    _, handle_q, quiet = new_vm(vdeps)
    attach(vdeps, handle_q, quiet, held, "/held", read_only=True)
    pauses.pause(vdeps, ALICE, command(c.VmHeldIn, handle=handle_p, vm_id=parked))

    report = drain_and_move(vdeps, "far")
    assert sorted(report.moved) == sorted([(writer, "local"), (reader, "local")])
    assert sorted(report.stayed) == sorted([
        (parked, "paused: only running VMs move"),
        (quiet, f"it shares volumes with VM {parked}, which stays")]) and not report.failed
    assert report.volumes == [(spare, "local")]  # no VM holds it: it follows too
    for vol, host in ((work, "local"), (shared, "local"), (held, "far"), (spare, "local")):
        got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume
        assert got.host == host, (vol, got)
    moved = vms.get(vdeps, ALICE, command(c.VmGetIn, vm_id=writer)).vm
    assert [(m.volume_id, m.path) for m in moved.volumes] == [(work, "/work"),
                                                              (shared, "/shared")]
    assert set(local_hv.domains[f"rift-{writer}"].disks) == {work, shared}
    with vdeps.store.read() as tx:
        details = [e.details for e in tx.events.page(moved.task_id, 0, 1000)
                   if e.type == "vm_moved"]
    assert details and details[0]["volumes"] == [work, shared]
