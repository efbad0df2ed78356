"""Pools of ready VMs against fakes: filling, hand-out (running and saved),
capacity, refusals, stale VMs, back-off, reconciliation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.operator import PoolSetIn
from rift.domain.clock import FakeClock
from rift.domain.pools import BACKOFF_S, PoolVm
from rift.services.background import reconcile
from rift.services.context import Deps, GuestRuntime
from rift.services.lifecycle import pool_filler, pools, tasks, vms
from rift.services.operator import hosts
from rift.services.operator.hosts import HostSize
from tests.support.engine import ALICE, event_types, refused, snapshot

FILLER = "test-filler"


def _handle(deps: Deps) -> str:
    return str(tasks.new(deps, ALICE, command(c.TaskNewIn)).handle)


def _members(deps: Deps) -> list[PoolVm]:
    with deps.store.read() as tx:
        return tx.pool_vms.all()


def _fill(deps: Deps) -> int:
    made = 0
    while (step := pool_filler.refill(deps, FILLER)):
        made += step
    return made


def test_a_running_pool_fills_and_hands_a_vm_over_under_its_own_id(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=2))
    assert _fill(deps) == 2
    ready = _members(deps)
    assert [m.state for m in ready] == ["ready", "ready"]
    assert all(local_hv.domains[f"rift-{m.id}"].active for m in ready)
    # Pooled domains carry the pool key's id, never a task's.
    assert {local_hv.domains[f"rift-{m.id}"].task_id for m in ready} == {ready[0].pool_id}
    handle = _handle(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    assert vm.id == ready[0].id and vm.status == "running"
    assert vm.start is not None and vm.start.kind == "pool"
    assert local_hv.domains[f"rift-{vm.id}"].task_id == vm.task_id  # marked with its task
    assert [m.id for m in _members(deps)] == [ready[1].id]
    assert event_types(deps, vm.task_id) == ["opened", "vm_creating", "vm_running"]
    # The filler puts one back.
    assert _fill(deps) == 1 and len(_members(deps)) == 2


def test_a_saved_pool_saves_its_vms_and_a_hand_out_restores_one(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", saved=1))
    assert _fill(deps) == 1
    (saved,) = _members(deps)
    domain = local_hv.domains[f"rift-{saved.id}"]
    assert saved.state == "saved" and domain.saved and not domain.active
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=_handle(deps), image="tiny")).vm
    assert vm.id == saved.id and vm.start is not None and vm.start.kind == "restore"
    assert local_hv.domains[f"rift-{vm.id}"].active


def test_a_request_no_pool_matches_boots(deps: Deps, local_hv: FakeHypervisor) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1))
    _fill(deps)
    for other in ({"memory_mib": 512}, {"vcpus": 2}, {"disk_gib": 20}, {"image": "debian"},
                  {"egress": "none"}):  # pooled VMs are `open`
        vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=_handle(deps),
                 **{"image": "tiny", **other})).vm
        assert vm.start is not None and vm.start.kind == "boot", other
    assert len(_members(deps)) == 1  # the pool kept its VM


def test_a_failed_restore_is_destroyed_and_the_vm_boots(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", saved=1))
    _fill(deps)
    (saved,) = _members(deps)
    local_hv.domains[f"rift-{saved.id}"].saved = False  # its saved state is gone
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=_handle(deps), image="tiny")).vm
    assert vm.status == "running" and vm.start is not None and vm.start.kind == "boot"
    assert local_hv.domains[f"rift-{vm.id}"].active
    assert ("destroy", f"rift-{vm.id}") in local_hv.calls


def test_pooled_vms_hold_room_on_their_host(deps: Deps, local_hv: FakeHypervisor) -> None:
    hosts.remove_host(deps, "local")
    hosts.add_host(deps, "small", "fake:///small", HostSize(4, 1024))
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=3))  # 3 x 256 MiB
    _fill(deps)
    err = refused("no_capacity", lambda: vms.new(deps, ALICE, command(c.VmNewIn,
                                     handle=_handle(deps), image="tiny", memory_mib=512)))
    assert err.details["largest_free"]["memory_mib"] == 256
    # A saved VM holds no memory: a saved pool beside them fits.
    pools.set_pool(deps, command(PoolSetIn, image="tiny", saved=2))
    _fill(deps)
    assert sorted(m.state for m in _members(deps)) == ["ready"] * 3 + ["saved"] * 2
    (listed,) = hosts.list_hosts(deps)
    assert (listed["used_memory_mib"], listed["vms"], listed["pooled"]) == (768, 0, 5)
    err = refused("invalid_argument", hosts.remove_host, deps, "small")
    assert "rift pool clear" in err.message


def test_a_pool_fills_no_host_under_its_disk_floor(deps: Deps, local_hv: FakeHypervisor) -> None:
    hosts.add_host(deps, "big", "fake:///big", HostSize(4, 100_000))  # placement's first choice
    deps.disk_room.free["big"] = 1 << 30  # as sampled: 1 GiB left, under the 4 GiB floor
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1))
    assert _fill(deps) == 1
    assert [m.host for m in _members(deps)] == ["local"]  # left out, as placement does
    hosts.drain_host(deps, "local")  # now only the full host has room
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=2))
    assert _fill(deps) == 0 and len(_members(deps)) == 1
    (row,) = [r.as_dict() for r in pools.pool_rows(deps)]
    assert "host big has 1.0 GiB of disk free" in row["last_error"]
    assert "RIFT_HOST_DISK_RESERVE_GIB" in row["last_error"]
    deps.disk_room.free["big"] = 50 << 30  # disk freed there
    assert _fill(deps) == 1
    assert sorted(m.host for m in _members(deps)) == ["big", "local"]
    (row,) = [r.as_dict() for r in pools.pool_rows(deps)]
    assert row["last_error"] is None


def test_a_pool_larger_than_its_hosts_is_refused_with_what_fits(deps: Deps) -> None:
    hosts.remove_host(deps, "local")
    hosts.add_host(deps, "small", "fake:///small", HostSize(4, 1024))
    before = snapshot(deps)
    err = refused("no_capacity", lambda: pools.set_pool(deps, command(PoolSetIn, image="tiny",
                                     running=5)))
    assert err.details["fits"] == 4 and "room for 4" in err.message and "--running 4" in err.hint
    err = refused("no_capacity", lambda: pools.set_pool(deps, command(PoolSetIn, image="tiny",
                                     running=1, memory_mib=4096)))
    assert err.details["fits"] == 0 and "fits on no usable host" in err.message
    err = refused("image_not_found", lambda: pools.set_pool(deps, command(PoolSetIn,
                                         image="windows", running=1)))
    assert "rift image build" in err.hint
    refused("invalid_argument", lambda: pools.set_pool(deps, command(PoolSetIn, image="tiny",
                                    running=-1)))
    refused("invalid_argument", lambda: pools.set_pool(deps, command(PoolSetIn, image="tiny",
                                    running=1, host="nowhere")))
    assert snapshot(deps) == before and pools.pool_rows(deps) == []
    # Resizing a pool counts its own VMs as room.
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=4))
    _fill(deps)
    assert pools.set_pool(deps, command(PoolSetIn, image="tiny", running=4)).running == 4


def test_stale_vms_are_replaced_and_extras_trimmed(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=2))
    _fill(deps)
    old = {m.id for m in _members(deps)}
    local_hv.version = "libvirt 99 (upgraded)"  # QEMU or libvirt changed under them
    _fill(deps)
    new = {m.id for m in _members(deps)}
    assert len(new) == 2 and not new & old
    assert not any(f"rift-{vm_id}" in local_hv.domains for vm_id in old)
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1))
    _fill(deps)
    assert len(_members(deps)) == 1 and len(local_hv.domains) == 1


def test_failed_starts_back_off(deps: Deps, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1))
    local_hv.fail_next_create("no room at the inn", times=2)
    assert pool_filler.refill(deps, FILLER) == 0
    (row,) = pools.pool_rows(deps)
    assert row.pool.failures == 1 and "no room at the inn" in (row.pool.last_error or "")
    assert pool_filler.refill(deps, FILLER) == 0  # backing off: nothing tried
    assert [op for op, _ in local_hv.calls].count("create") == 1
    clock.advance(BACKOFF_S[0] + 1)
    assert pool_filler.refill(deps, FILLER) == 0  # the second failure
    clock.advance(BACKOFF_S[1] + 1)
    assert pool_filler.refill(deps, FILLER) == 1
    (row,) = pools.pool_rows(deps)
    assert row.pool.failures == 0 and row.pool.last_error is None and row.running_ready == 1
    assert _members(deps)[0].state == "ready" and len(local_hv.domains) == 1


def test_one_replica_fills_a_pool_at_a_time(deps: Deps, clock: FakeClock) -> None:
    pool = pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1))
    now = clock.now()
    with deps.store.write() as tx:
        assert tx.pools.save(pool.fill_claimed("replica-a", now, clock.advance(60)), pool)
    assert pool_filler.refill(deps, "replica-b") == 0  # a holds it
    clock.advance(1)
    assert pool_filler.refill(deps, "replica-b") == 1  # a's hold ran out


def test_reconciliation_keeps_pool_domains_and_drops_what_a_crash_left(
        deps: Deps, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=2))
    _fill(deps)
    first, second = _members(deps)
    local_hv.add_foreign_domain("rift-vm_zzzzzzzz", first.pool_id, "vm_zzzzzzzz")
    clock.advance(1)
    report = reconcile.reconcile(deps)
    assert report.orphans_destroyed == ["rift-vm_zzzzzzzz"]
    assert {f"rift-{first.id}", f"rift-{second.id}"} == set(local_hv.domains)
    del local_hv.domains[f"rift-{second.id}"]  # vanished behind Rift's back
    report = reconcile.reconcile(deps)
    assert report.pool_vms_removed == [second.id]
    assert [m.id for m in _members(deps)] == [first.id]


def test_a_start_a_crash_cut_is_removed_after_the_grace(
        deps: Deps, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    pool = pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1))
    with deps.store.write() as tx:
        tx.pool_vms.add(PoolVm(
            id="vm_cutcutcu", pool_id=pool.id, goal="running", state="starting", host="local",
            image="tiny", vcpus=1, memory_mib=256, key_id=pool.id, mark="m",
            created_at=clock.now()))
    local_hv.add_foreign_domain("rift-vm_cutcutcu", pool.id, "vm_cutcutcu")
    assert reconcile.reconcile(deps).pool_vms_removed == []
    assert "rift-vm_cutcutcu" in local_hv.domains  # kept while it may still be starting
    clock.advance(deps.limits.creating_grace_s + 1)
    assert reconcile.reconcile(deps).pool_vms_removed == ["vm_cutcutcu"]
    assert "rift-vm_cutcutcu" not in local_hv.domains


def test_clearing_a_pool_destroys_its_vms(deps: Deps, local_hv: FakeHypervisor) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1, saved=1))
    _fill(deps)
    assert pools.clear_pool(deps, "tiny") == 2
    assert local_hv.domains == {} and pools.pool_rows(deps) == [] and _members(deps) == []


def test_pool_list_says_what_is_wanted_and_ready(deps: Deps) -> None:
    pools.set_pool(deps, command(PoolSetIn, image="tiny", running=2, saved=1))
    assert pool_filler.refill(deps, FILLER) == 1  # one start at a time per host
    (row,) = [r.as_dict() for r in pools.pool_rows(deps)]
    assert row["running"] == {"want": 2, "ready": 1} and row["saved"] == {"want": 1, "ready": 0}
    _fill(deps)
    (row,) = [r.as_dict() for r in pools.pool_rows(deps)]
    assert row == {"image": "tiny", "host": None, "vcpus": 1, "memory_mib": 256,
                   "running": {"want": 2, "ready": 2}, "saved": {"want": 1, "ready": 1},
                   "last_error": None}
    assert pools.pool_counts(deps) == {("tiny", "ready"): 2, ("tiny", "saved"): 1}


@pytest.mark.parametrize("image", ["tiny", "debian"])
def test_debian_pools_default_to_its_memory(deps: Deps, image: str) -> None:
    assert pools.set_pool(deps, command(PoolSetIn, image=image,
               running=1)).memory_mib == {"tiny": 256, "debian": 512}[image]


def test_an_images_build_digest_changes_when_it_is_rebuilt(
        deps: Deps, tmp_path: Path) -> None:
    runtime = GuestRuntime(images_dir=tmp_path, serial_dir=tmp_path, boot_timeout_s=1,
                           accel=lambda uri: "qemu")
    with_runtime = dataclasses.replace(deps, runtime=runtime)
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"v": 1}')
    before = pool_filler.image_build(with_runtime, "tiny")
    assert pool_filler.image_build(with_runtime, "tiny") == before  # stable while unchanged
    (folder / "manifest.json").write_text('{"v": 22}')
    assert pool_filler.image_build(with_runtime, "tiny") != before
    assert pool_filler.image_build(with_runtime, "debian") != before  # another image
