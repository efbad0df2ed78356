"""Code contexts' rows (``tx.code_contexts``, migration 0020, SPEC §20) on every
database: a context is written and read back per VM, a run's start and end move
its run in flight and its last run (an earlier run's end leaves a later run in
flight), runs past their bound expire, and the rows go with their VM or their
task's tombstone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rift.domain.code_contexts import CodeContext, RunEnd
from rift.domain.store_errors import MissingReference
from rift.services.ports import Store
from tests.support.store_rows import a_task, a_vm, at, insert


def a_context(vm_id: str, task_id: str, context_id: str = "default",
              after: float = 0) -> CodeContext:
    return CodeContext(vm_id=vm_id, id=context_id, task_id=task_id, language="python",
                       cwd=None, created_at=at(after))


def test_contexts_are_written_read_per_vm_oldest_first_and_need_their_vm(store: Store) -> None:
    task = a_task()
    vm, other = a_vm(task, status="running"), a_vm(task, status="running")
    insert(store, task, vm, other)
    with store.write() as tx:
        tx.code_contexts.put(a_context(vm.id, task.id, "ctx_bbbbbbbb", after=2))
        tx.code_contexts.put(a_context(vm.id, task.id, "default", after=1))
        tx.code_contexts.put(replace(a_context(vm.id, task.id, "ctx_bbbbbbbb", after=2),
                                     cwd="/srv"))
        with pytest.raises(MissingReference):
            tx.code_contexts.put(a_context("vm_zzzzzzzz", task.id))
    with store.read() as tx:
        found = tx.code_contexts.of_vms([vm.id, other.id])
        assert [x.id for x in found[vm.id]] == ["default", "ctx_bbbbbbbb"]
        assert found[other.id] == []
        kept = tx.code_contexts.get(vm.id, "ctx_bbbbbbbb")
        assert kept is not None and kept.cwd == "/srv"  # put again: replaced, not added
        assert tx.code_contexts.get(other.id, "default") is None


def test_a_runs_start_and_end_move_its_run_in_flight_and_its_last_run(store: Store) -> None:
    task = a_task()
    vm = a_vm(task, status="running")
    insert(store, task, vm)
    with store.write() as tx:
        tx.code_contexts.put(a_context(vm.id, task.id))
        assert tx.code_contexts.run_started(vm.id, "default", "run_aaaaaaaa", at(60)) is True
        assert tx.code_contexts.run_started(vm.id, "ctx_none0000", "run_x", at(60)) is False
        assert tx.code_contexts.run_started(vm.id, "default", "run_bbbbbbbb", at(120)) is True
    with store.read() as tx:
        row = tx.code_contexts.get(vm.id, "default")
        assert row is not None and (row.run_id, row.run_until) == ("run_bbbbbbbb", at(120))
        assert row.running_at(at(119)) and not row.running_at(at(120))
    with store.write() as tx:  # the earlier run ends: the later one is still in flight
        assert tx.code_contexts.run_ended(vm.id, "default", RunEnd("run_aaaaaaaa", at(5), 1,
                                                                   "ok")) is True
    with store.read() as tx:
        row = tx.code_contexts.get(vm.id, "default")
        assert row is not None
        assert (row.last_run_at, row.execution_count, row.last_status, row.run_id) == (
            at(5), 1, "ok", "run_bbbbbbbb")
    with store.write() as tx:
        tx.code_contexts.run_ended(vm.id, "default", RunEnd("run_bbbbbbbb", at(9), 2, "error"))
    with store.read() as tx:
        row = tx.code_contexts.get(vm.id, "default")
        assert row is not None
        assert (row.last_run_at, row.execution_count, row.last_status, row.run_id,
                row.run_until) == (at(9), 2, "error", None, None)


def test_runs_past_their_bound_expire_and_rows_go_with_their_vm_and_tombstone(
        store: Store) -> None:
    task, gone = a_task(), a_task(status="closed", closed_at=at(-100), close_reason="idle")
    vm, kept, purged = (a_vm(task, status="running"), a_vm(task, status="running"),
                       a_vm(gone, status="destroyed"))
    insert(store, task, gone, vm, kept, purged)
    with store.write() as tx:
        tx.code_contexts.put(a_context(vm.id, task.id))
        tx.code_contexts.put(a_context(vm.id, task.id, "ctx_aaaaaaaa"))
        tx.code_contexts.put(a_context(kept.id, task.id))
        tx.code_contexts.run_started(vm.id, "default", "run_aaaaaaaa", at(10))
        tx.code_contexts.run_started(kept.id, "default", "run_bbbbbbbb", at(100))
        assert tx.code_contexts.expire_runs(at(10)) == 1
        assert tx.code_contexts.expire_runs(at(10)) == 0
        row = tx.code_contexts.get(kept.id, "default")
        assert row is not None and row.run_id == "run_bbbbbbbb"
        assert tx.code_contexts.remove(vm.id, "ctx_aaaaaaaa") == 1
        assert tx.code_contexts.remove(vm.id) == 1
        assert tx.code_contexts.of_vms([vm.id]) == {vm.id: []}
        tx.code_contexts.put(a_context(purged.id, gone.id))  # left by a crash, say
    with store.write() as tx:
        assert tx.tasks.purge_closed_before(at(0), 10) == [gone.id]
    with store.read() as tx:
        assert tx.code_contexts.of_vms([purged.id, kept.id]) == {
            purged.id: [], kept.id: [replace(a_context(kept.id, task.id), run_id="run_bbbbbbbb",
                                             run_until=at(100))]}
