"""`volumes` on `rift_vm_new` (SPEC §18) against fakes: attached once the VM runs,
refused before anything starts when an attach would be, and all or none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.operator import PoolSetIn
from rift.services.context import Deps
from rift.services.lifecycle import pool_filler, pools, tasks, vms, volumes
from tests.support.engine import ALICE, BOB, event_types, refused
from tests.support.volumes import Files, Mounts
from tests.support.volumes import attach as _attach
from tests.support.volumes import new_vm as _vm
from tests.support.volumes import new_volume as _volume


@pytest.fixture
def vdeps(deps: Deps) -> Deps:
    return replace(deps, volume_files=Files(), mounts=Mounts())


def _new(deps: Deps, handle: str, wanted: list[dict[str, object]],
         caller: object = ALICE) -> c.VmOut:
    return vms.new(deps, caller, command(c.VmNewIn, handle=handle, image="tiny",  # type: ignore[arg-type]
                                         volumes=wanted))


def _task(deps: Deps, caller: object = ALICE) -> tuple[str, str]:
    opened = tasks.new(deps, caller, command(c.TaskNewIn))  # type: ignore[arg-type]
    return opened.task.id, str(opened.handle)


def _live(deps: Deps, task_id: str) -> int:
    with deps.store.read() as tx:
        return tx.vms.count_live(task_id)


def test_a_new_vm_starts_with_its_volumes_attached(vdeps: Deps,
                                                   local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(vdeps)
    work, data = _volume(vdeps, "work"), _volume(vdeps, "data")
    vm = _new(vdeps, handle, [{"volume_id": work, "path": "/work/"},
                              {"volume_id": data, "path": "/data", "read_only": True}]).vm
    assert vm.status == "running"
    assert [(m.volume_id, m.path, m.read_only) for m in vm.volumes] == [
        (work, "/work", False), (data, "/data", True)]
    disks = local_hv.domains[f"rift-{vm.id}"].disks
    assert {s: (d.target, d.read_only) for s, d in disks.items()} == {
        work: ("vdc", False), data: ("vdd", True)}
    assert event_types(vdeps, task_id).count("volume_attached") == 2
    assert vms.new(vdeps, ALICE, command(c.VmNewIn, handle=handle)).vm.volumes == []


def test_what_an_attach_would_refuse_is_refused_before_the_vm_starts(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    _, writer_handle, writer = _vm(vdeps)
    held = _volume(vdeps, "held")
    _attach(vdeps, writer_handle, writer, held)
    task_id, handle = _task(vdeps)
    before = set(local_hv.domains)
    busy = refused("volume_busy", _new, vdeps, handle, [{"volume_id": held, "path": "/w"}])
    assert busy.details["vm_id"] == writer
    theirs = _volume(vdeps, "theirs", caller=BOB)
    refused("volume_not_found", _new, vdeps, handle, [{"volume_id": theirs, "path": "/w"}])
    free = _volume(vdeps, "free")
    twice = refused("invalid_argument", _new, vdeps, handle, [
        {"volume_id": free, "path": "/a"}, {"volume_id": free, "path": "/b"}])
    assert twice.details["field"] == "volumes"
    other = _volume(vdeps, "other")
    refused("invalid_argument", _new, vdeps, handle, [
        {"volume_id": free, "path": "/a"}, {"volume_id": other, "path": "/a/"}])
    bad = refused("invalid_argument", _new, vdeps, handle, [{"volume_id": free, "path": "/etc"}])
    assert bad.details["field"] == "path"
    assert _live(vdeps, task_id) == 0 and set(local_hv.domains) == before


def test_an_attach_refused_after_the_start_destroys_the_new_vm(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(vdeps)
    first, second = _volume(vdeps, "first"), _volume(vdeps, "second")
    local_hv.fail_next("attach", "internal error: unable to execute QEMU command")
    refused("hypervisor_error", _new, vdeps, handle, [
        {"volume_id": first, "path": "/a"}, {"volume_id": second, "path": "/b"}])
    assert _live(vdeps, task_id) == 0
    assert "vm_destroyed" in event_types(vdeps, task_id)
    for vol in (first, second):
        got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume
        assert got.attached_to == []


def test_a_vm_handed_out_from_a_pool_gets_its_volumes(vdeps: Deps,
                                                      local_hv: FakeHypervisor) -> None:
    pools.set_pool(vdeps, command(PoolSetIn, image="tiny", running=1))
    while pool_filler.refill(vdeps, "test-filler"):
        pass
    with vdeps.store.read() as tx:
        (pooled,) = tx.pool_vms.all()
    _, handle = _task(vdeps)
    work = _volume(vdeps, "work")
    vm = _new(vdeps, handle, [{"volume_id": work, "path": "/work"}]).vm
    assert vm.id == pooled.id and vm.start is not None and vm.start.kind == "pool"
    assert [(m.volume_id, m.path) for m in vm.volumes] == [(work, "/work")]
    assert work in local_hv.domains[f"rift-{vm.id}"].disks


def test_a_new_vm_goes_to_its_volumes_host_and_takes_a_pooled_vm_only_from_there(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    from rift.services.operator import hosts

    work = _volume(vdeps, "work")  # on `local`, the first host by name
    hosts.add_host(vdeps, "zzz", "fake:///zzz", hosts.HostSize(64, 1_000_000))  # most room
    _, handle = _task(vdeps)
    assert vms.new(vdeps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm.host \
        == "zzz"  # placement's own choice
    pools.set_pool(vdeps, command(PoolSetIn, image="tiny", running=1))
    while pool_filler.refill(vdeps, "test-filler"):
        pass
    with vdeps.store.read() as tx:
        assert [p.host for p in tx.pool_vms.all()] == ["zzz"]
    vm = _new(vdeps, handle, [{"volume_id": work, "path": "/work"}]).vm
    assert (vm.host, vm.start.kind if vm.start else None) == ("local", "boot")
    assert [m.volume_id for m in vm.volumes] == [work]
    hosts.drain_host(vdeps, "local")  # a second volume lands on zzz
    there = _volume(vdeps, "there")
    hosts.drain_host(vdeps, "local", drained=False)
    pooled = _new(vdeps, handle, [{"volume_id": there, "path": "/there"}]).vm
    assert (pooled.host, pooled.start.kind if pooled.start else None) == ("zzz", "pool")
    vms.destroy(vdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=vm.id))
    vms.destroy(vdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=pooled.id))
    split = refused("invalid_argument", _new, vdeps, handle, [
        {"volume_id": work, "path": "/work"}, {"volume_id": there, "path": "/there"}])
    assert split.details["field"] == "volumes" and "local" in split.message
