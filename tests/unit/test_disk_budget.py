"""The per-user disk budget (SPEC §15): overlays as measured, paused VMs' memory and
snapshots count; at the budget a new VM, a snapshot, a fork and a pause are refused
with `quota_exceeded`, other users are not, and freeing disk makes room again."""

from __future__ import annotations

import json
from dataclasses import replace

from rift.services import snapshots, tasks, vm_state, vms
from rift.services.context import Deps
from rift.services.disk_budget import GIB, disk_used_bytes
from tests.support.engine import ALICE, BOB, refused


def _budgeted(deps: Deps, gib: int) -> Deps:
    return replace(deps, limits=replace(deps.limits, max_disk_gib_per_user=gib))


def _measured(deps: Deps, vm_id: str, disk_bytes: int) -> None:
    """As the usage sample would write it: the overlay's allocation on its host."""
    stats = json.dumps({"now": {"disk_used_bytes": disk_bytes}})
    with deps.store.write() as tx:
        assert tx.vms.update(vm_id, ("running",), stats=stats)


def test_a_user_at_the_budget_gets_quota_exceeded_and_others_do_not(deps: Deps) -> None:
    deps = _budgeted(deps, 2)
    opened = tasks.new_task(deps, ALICE)
    handle = str(opened.handle)
    vm = vms.new_vm(deps, ALICE, handle, image="tiny")
    _measured(deps, vm.id, 2 * GIB)  # a guest that filled its disk
    with deps.store.read() as tx:
        assert disk_used_bytes(tx, "alice") == 2 * GIB
    error = refused("quota_exceeded", vms.new_vm, deps, ALICE, handle, image="tiny")
    assert "disk per user" in error.message and "rift_vm_destroy" in error.hint
    refused("quota_exceeded", snapshots.make, deps, ALICE, handle, vm.id)
    refused("quota_exceeded", snapshots.fork, deps, ALICE, handle, vm_id=vm.id)
    refused("quota_exceeded", vm_state.pause, deps, ALICE, handle, vm.id)
    theirs = tasks.new_task(deps, BOB)
    assert vms.new_vm(deps, BOB, str(theirs.handle), image="tiny").status == "running"
    vms.destroy(deps, ALICE, vm.id, handle=handle)  # frees its overlay
    assert vms.new_vm(deps, ALICE, handle, image="tiny").status == "running"


def test_paused_memory_and_snapshots_count(deps: Deps) -> None:
    opened = tasks.new_task(deps, ALICE)
    handle = str(opened.handle)
    vm = vms.new_vm(deps, ALICE, handle, image="tiny", memory_mib=512)
    with deps.store.read() as tx:
        assert disk_used_bytes(tx, "alice") == 0
    vm_state.pause(deps, ALICE, handle, vm.id)
    with deps.store.read() as tx:
        assert disk_used_bytes(tx, "alice") == 512 << 20
        assert disk_used_bytes(tx, "bob") == 0
