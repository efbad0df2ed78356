"""The per-user disk budget (SPEC §15): overlays as measured, paused VMs' memory and
snapshots count; at the budget a new VM, a snapshot, a fork and a pause are refused
with `quota_exceeded`, other users are not, and freeing disk makes room again."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from hypervisor.host_disk import LOCAL_DISK
from rift.contract import tools as c
from rift.contract.base import command
from rift.services.background import usage
from rift.services.context import Deps, GuestRuntime
from rift.services.lifecycle import forks, pauses, snapshots, tasks, vms
from rift.services.lifecycle.disk_budget import GIB, disk_used_bytes
from rift.services.operator import hosts
from rift.services.operator.hosts import HostSize
from tests.support.engine import ALICE, BOB, refused


def _budgeted(deps: Deps, gib: int) -> Deps:
    return replace(deps, limits=replace(deps.limits, max_disk_gib_per_user=gib))


def _measured(deps: Deps, vm_id: str, disk_bytes: int) -> None:
    """As the usage sample would write it: the overlay's allocation on its host."""
    stats = json.dumps({"now": {"disk_used_bytes": disk_bytes}})
    with deps.store.write() as tx:
        assert tx.vms.record_stats(vm_id, stats)


def test_a_user_at_the_budget_gets_quota_exceeded_and_others_do_not(deps: Deps) -> None:
    deps = _budgeted(deps, 2)
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    _measured(deps, vm.id, 2 * GIB)  # a guest that filled its disk
    with deps.store.read() as tx:
        assert disk_used_bytes(tx, "alice") == 2 * GIB
    error = refused("quota_exceeded", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
                                          image="tiny")))
    assert "disk per user" in error.message and "rift_vm_destroy" in error.hint
    refused("quota_exceeded", lambda: snapshots.make(deps, ALICE, command(c.VmSnapshotIn,
                                  handle=handle, vm_id=vm.id)))
    refused("quota_exceeded", lambda: forks.fork(deps, ALICE, command(c.VmForkIn, handle=handle,
                                  vm_id=vm.id)))
    refused("quota_exceeded", lambda: pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle,
                                  vm_id=vm.id)))
    theirs = tasks.new(deps, BOB, command(c.TaskNewIn))
    assert vms.new(deps, BOB, command(c.VmNewIn, handle=str(theirs.handle),
               image="tiny")).vm.status == "running"
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm.id,
        handle=handle))  # frees its overlay
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
               image="tiny")).vm.status == "running"


def test_paused_memory_and_snapshots_count(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", memory_mib=512)).vm
    with deps.store.read() as tx:
        assert disk_used_bytes(tx, "alice") == 0
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm.id))
    with deps.store.read() as tx:
        assert disk_used_bytes(tx, "alice") == 512 << 20
        assert disk_used_bytes(tx, "bob") == 0


def test_a_host_under_its_disk_floor_takes_no_new_vm_snapshot_or_pause(deps: Deps) -> None:
    hosts.add_host(deps, "big", "fake:///big", HostSize(4, 100_000))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    assert vm.host == "big"
    deps.disk_room.free["big"] = 1 << 30  # as sampled: 1 GiB left, under the 4 GiB floor
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
               image="tiny")).vm.host == "local"  # placed elsewhere
    for call, model in ((snapshots.make, c.VmSnapshotIn), (pauses.pause, c.VmHeldIn)):
        error = refused("quota_exceeded", call, deps, ALICE, model(handle=handle, vm_id=vm.id))
        assert error.details["host"] == "big"
    hosts.drain_host(deps, "local")  # now only the full host has room
    error = refused("quota_exceeded", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
                                          image="tiny")))
    assert error.details == {"host": "big", "free_bytes": 1 << 30}
    assert "RIFT_HOST_DISK_RESERVE_GIB" in error.message
    deps.disk_room.free["big"] = 50 << 30  # disk freed there
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm.host == "big"


def test_the_free_disk_of_a_folder_not_made_yet_is_its_file_systems(tmp_path: Path) -> None:
    free = LOCAL_DISK.free(str(tmp_path / "not" / "yet"))
    assert abs(free - shutil.disk_usage(tmp_path).free) < 64 << 20  # others write meanwhile


def test_usage_sampling_notes_each_hosts_free_disk(deps: Deps, tmp_path: Path) -> None:
    runtime = GuestRuntime(images_dir=tmp_path / "images", serial_dir=tmp_path / "serial",
                           boot_timeout_s=1.0, accel=lambda uri: "tcg")
    sampled = replace(deps, runtime=runtime)
    usage.sample_usage(sampled, 60.0)
    assert abs(sampled.disk_room.free["local"] - shutil.disk_usage(tmp_path).free) < 64 << 20
