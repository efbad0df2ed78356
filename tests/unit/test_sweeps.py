"""The sweep: idle close exact to the second, finished closes, purge, idempotence."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.operator import PoolSetIn
from rift.domain.clock import FakeClock
from rift.domain.pools import PoolVm
from rift.guest.adapter import ssh_guests
from rift.guest.keys import keep_boot_key, key_for_task
from rift.services.background import sweeps
from rift.services.context import Deps
from rift.services.lifecycle import pools, tasks, vms
from rift.services.lifecycle.teardown import Closing, close_in_tx
from tests.support.engine import ALICE, event_types, refused


def test_a_task_closes_itself_at_the_idle_period_not_a_second_before(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle)))
    clock.advance(14399)
    assert sweeps.sweep(deps).closed == []
    clock.advance(1)
    report = sweeps.sweep(deps)
    assert report.closed == [opened.task.id] and len(report.destroyed) == 1
    view = tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=opened.task.id)).task
    assert view.status == "closed" and view.close_reason == "idle"
    assert local_hv.domains == {}
    with deps.store.read() as tx:
        closed = [e for e in tx.events.page(opened.task.id, 0, 100) if e.type == "closed"]
    assert closed[0].actor == "sweep" and closed[0].details["quiet_s"] == 14400


def test_a_touch_restarts_the_idle_timer(deps: Deps, clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    clock.advance(14000)
    tasks.get(deps, ALICE, command(c.TaskGetIn, handle=str(opened.handle)))
    clock.advance(14000)
    assert sweeps.sweep(deps).closed == []
    clock.advance(400)
    assert sweeps.sweep(deps).closed == [opened.task.id]


def test_a_second_sweep_changes_nothing(deps: Deps, clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    clock.advance(14400)
    sweeps.sweep(deps)
    again = sweeps.sweep(deps)
    assert again.closed == [] and again.destroyed == []
    assert event_types(deps, opened.task.id).count("closed") == 1


def test_the_sweep_finishes_a_close_interrupted_before_its_vms_were_destroyed(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.write() as tx:  # the process died right after this commit
        task = tx.tasks.get(opened.task.id)
        assert task is not None
        close_in_tx(tx, task, Closing("mcp:claude-code", "closed", deps.clock.now()))
    assert len(local_hv.domains) == 1
    assert sweeps.sweep(deps).destroyed == [vm.id]
    assert local_hv.domains == {}
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.status == "destroyed"


def test_a_refused_destroy_is_retried_by_the_next_sweep(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    local_hv.fail_destroy("cannot acquire state change lock")
    closed = tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=str(opened.handle)))
    assert closed.destroyed == [] and closed.task.vms[0].status == "running"
    assert sweeps.sweep(deps).refused == [vm.id]
    local_hv.fail_destroy(None)
    assert sweeps.sweep(deps).destroyed == [vm.id]
    assert local_hv.domains == {}


def test_closed_tasks_are_readable_until_their_retention_passes(
        deps: Deps, clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=str(opened.handle)))
    clock.advance(deps.limits.closed_retention_s - 1)
    sweeps.sweep(deps)
    assert tasks.get(deps, ALICE, command(c.TaskGetIn,
               task_id=opened.task.id)).task.status == "closed"
    clock.advance(2)
    assert sweeps.sweep(deps).purged == 1
    refused("task_not_found", lambda: tasks.get(deps, ALICE, command(c.TaskGetIn,
                                  task_id=opened.task.id)))


def test_the_sweep_closes_many_due_tasks_in_batches(make_deps, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
    deps = make_deps(max_open_tasks=1000, rate_task_new_per_h=1000)
    for _ in range(sweeps.BATCH + 5):
        tasks.new(deps, ALICE, command(c.TaskNewIn, name="old"))
    clock.advance(timedelta(hours=5).total_seconds())
    assert len(sweeps.sweep(deps).closed) == sweeps.BATCH + 5


def test_the_sweep_forgets_the_key_of_a_task_closed_idle_without_a_vm(
        deps: Deps, clock: FakeClock, tmp_path: Path) -> None:
    """An idle close destroys no VM, so nothing else would delete the key; one of
    an open task, or of a closed task whose VM still lives, stays."""
    deps = dataclasses.replace(deps, guests=ssh_guests(tmp_path / "keys"))
    idle, busy = (tasks.new(deps, ALICE, command(c.TaskNewIn)),
                  tasks.new(deps, ALICE, command(c.TaskNewIn)))
    for opened in (idle, busy):
        deps.guests.keys.task_key(opened.task.id)
    clock.advance(14000)
    tasks.get(deps, ALICE, command(c.TaskGetIn, handle=str(busy.handle)))
    clock.advance(400)
    report = sweeps.sweep(deps)
    assert report.closed == [idle.task.id] and report.keys_forgotten == 1
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [busy.task.id]


def test_a_handed_out_vms_boot_key_stays_while_the_vm_lives_and_goes_after(
        deps: Deps, tmp_path: Path) -> None:
    """A pooled VM's boot key (its pool's key kept under the VM's id) outlives the
    pool, so the VM can be handed over again after a reboot; the sweep deletes it
    once the VM is destroyed."""
    keys = tmp_path / "keys"
    deps = dataclasses.replace(deps, guests=ssh_guests(keys))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    key_for_task(keys, "pool_k3v9x2m7")  # no such pool: its key goes too
    keep_boot_key(keys, "pool_k3v9x2m7", vm.id)
    assert sweeps.sweep(deps).keys_forgotten == 1
    assert (keys / vm.id).exists()
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm.id, handle=str(opened.handle)))
    assert sweeps.sweep(deps).keys_forgotten == 1
    assert not (keys / vm.id).exists()


def test_a_pooled_vms_boot_key_stays_before_it_is_handed_out(
        deps: Deps, tmp_path: Path) -> None:
    """A pooled VM of a snapshot image logs in with the image's key, kept under its
    id, while it starts and waits in its pool: the sweep keeps that key (it once
    deleted it mid-start, and the VM never answered a login)."""
    keys = tmp_path / "keys"
    deps = dataclasses.replace(deps, guests=ssh_guests(keys))
    pool = pools.set_pool(deps, command(PoolSetIn, image="tiny", running=1))
    key_for_task(keys, pool.id)
    image_key = tmp_path / "image-key"
    key_for_task(tmp_path, "image-key")
    with deps.store.write() as tx:
        tx.pool_vms.add(PoolVm(
            id="vm_pooledaa", pool_id=pool.id, goal="running", state="starting",
            host="local", image="tiny", vcpus=1, memory_mib=256, key_id=pool.id, mark="m",
            created_at=deps.clock.now()))
    keep_boot_key(keys, pool.id, "vm_pooledaa", source=image_key)
    keep_boot_key(keys, pool.id, "vm_goneaaaa", source=image_key)  # no row of either kind
    assert sweeps.sweep(deps).keys_forgotten == 1
    assert (keys / "vm_pooledaa").exists() and not (keys / "vm_goneaaaa").exists()
