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


FAR = "qemu+ssh://root@far.example/system"


def _far_after_start(deps: Deps, pool: FakePool) -> None:
    """Host "far" (a fake, where its VMs started) is a host elsewhere from now on:
    its URI becomes FAR's (the fake guests run only on fake URIs)."""
    pool.by_uri[FAR] = pool.hypervisor("fake:///far")
    with deps.store.write() as tx:
        was = tx.hosts.get("far", lock=True)
        assert was is not None
        assert tx.hosts.save(was.resized(FAR, was.vcpus, was.memory_mib), was)


def test_a_vm_holding_volumes_on_a_host_elsewhere_carries_them_and_shared_ones_stay(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor) -> None:
    """From a host elsewhere a VM's volumes go with it: each put on the destination
    first (`send`: an overlay for a writable one, a whole copy for one it only reads),
    the migration carries their blocks (`copy_volumes`), the rows name the
    destination and the source's files go; a volume there two VMs read stays with
    both (`volume_busy` in the report); one no VM holds is copied whole and follows."""
    from dataclasses import replace

    from rift.services.lifecycle import volumes
    from tests.support.volumes import Files, Mounts, attach, new_vm, new_volume

    files = Files()
    vdeps = replace(deps, volume_files=files, mounts=Mounts())
    hosts.add_host(vdeps, "far", "fake:///far", HostSize(64, 1_000_000))
    _, handle, writer = new_vm(vdeps)
    _, handle_a, one = new_vm(vdeps)
    _, handle_b, two = new_vm(vdeps)
    work, kept, shared, spare = (new_volume(vdeps, n) for n in ("work", "kept", "shared",
                                                                "spare"))
    attach(vdeps, handle, writer, work, "/work")
    attach(vdeps, handle, writer, kept, "/kept", read_only=True)
    attach(vdeps, handle_a, one, shared, "/shared", read_only=True)
    attach(vdeps, handle_b, two, shared, "/shared", read_only=True)
    local_uri = next(h["uri"] for h in hosts.list_hosts(vdeps) if h["name"] == "local")
    _far_after_start(vdeps, pool)
    files.calls.clear()

    report = drain_and_move(vdeps, "far")
    assert report.moved == [(writer, "local")] and not report.failed
    holding = ", ".join(sorted((one, two)))
    why = (f"volume_busy: volume {shared}, on a host elsewhere, is held by VMs {holding}; "
           "it moves with one VM only: rift_vm_detach_volume it from the others")
    assert sorted(report.stayed) == sorted([(one, why), (two, why)])
    assert report.volumes == [(spare, "local")]
    assert files.calls == [
        ("send", work, FAR, local_uri, "top"), ("send", kept, FAR, local_uri, "whole"),
        ("remove", work), ("remove", kept),  # from far, once the rows name local
        ("send", spare, FAR, local_uri, "whole"), ("remove", spare)]
    assert pool.hypervisor(FAR).volumes_copied == [f"rift-{writer}"]
    for vol, host in ((work, "local"), (kept, "local"), (shared, "far"), (spare, "local")):
        assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.host \
            == host, vol
    assert set(local_hv.domains[f"rift-{writer}"].disks) == {work, kept}


def test_a_failed_move_from_a_host_elsewhere_removes_what_it_put_on_the_destination(
        deps: Deps, pool: FakePool) -> None:
    from rift.services.lifecycle import volumes
    from tests.support.volumes import far_vm_with_volume

    vdeps, files, _, vm_id, work = far_vm_with_volume(deps)
    _far_after_start(vdeps, pool)
    files.calls.clear()
    pool.hypervisor(FAR).fail_next("migrate", "migration job: unexpectedly failed")
    report = drain_and_move(vdeps, "far")
    assert [v for v, _ in report.failed] == [vm_id] and not report.moved
    assert [call[:2] for call in files.calls] == [("send", work), ("remove", work)]
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=work)).volume.host == "far"
