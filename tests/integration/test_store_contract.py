"""The store contract: one set of tests, run against every database.

``store`` (from tests/conftest_store.py) gives an empty store on each database:
SQLite, and PostgreSQL when RIFT_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool
from sqlalchemy.exc import StatementError

from rift.domain.ids import new_exec_id, new_task_id, new_token_id, new_vm_id
from rift.domain.model import ApiToken, Exec, ExecEnd, Host, NewEvent, Task, User, Vm
from rift.domain.pools import Pool, PoolVm
from rift.domain.records import HostUsage, RateWindow, Snapshot
from rift.domain.store_errors import DuplicateKey, MissingReference, ReadOnlyTransaction
from rift.services.ports import Store
from rift.store.migrate import current_revision, head_revision, upgrade
from rift.store.tables import metadata
from tests.support.store_rows import T0, a_task, a_vm, at, insert


def an_exec(vm: Vm, **changes: Any) -> Exec:
    ex = Exec(id=new_exec_id(), task_id=vm.task_id, vm_id=vm.id, owner=vm.owner,
              command="make -j2 && ./test", status="running", timeout_s=60, started_at=T0)
    return dataclasses.replace(ex, **changes)


def a_token(user: str, digest: str, created_at: datetime = T0) -> ApiToken:
    return ApiToken(id=new_token_id(), user=user, label="laptop", digest=digest,
                    created_at=created_at)


def ids(rows: list[Task] | list[Vm] | list[Exec]) -> list[str]:
    return [row.id for row in rows]


def ids_of_tokens(tokens: list[ApiToken]) -> list[str]:
    return [t.id for t in tokens]


# users and tokens


def test_users_are_added_read_listed_by_name_and_counted(store: Store) -> None:
    with store.write() as tx:
        tx.users.add(User(name="grace", password_hash="$argon2id$x", created_at=T0))
        tx.users.add(User(name="ada", password_hash=None, created_at=at(1)))
    with store.read() as tx:
        assert tx.users.get("grace") == User(name="grace", password_hash="$argon2id$x",
                                             created_at=T0)
        assert tx.users.get("nobody") is None
        assert [u.name for u in tx.users.all()] == ["ada", "grace"]
        assert tx.users.count() == 2


def test_adding_a_user_twice_is_a_duplicate_key(store: Store) -> None:
    with store.write() as tx:
        tx.users.add(User(name="ada", password_hash=None, created_at=T0))
    with pytest.raises(DuplicateKey) as raised, store.write() as tx:
        tx.users.add(User(name="ada", password_hash=None, created_at=T0))
    assert (raised.value.table, raised.value.field) == ("users", "name")


def test_tokens_are_found_by_digest_and_id_and_listed_oldest_first(store: Store) -> None:
    first, second = a_token("ada", "1" * 64, at(5)), a_token("ada", "2" * 64, at(1))
    with store.write() as tx:
        tx.users.add(User(name="ada", password_hash=None, created_at=T0))
        tx.users.add(User(name="grace", password_hash=None, created_at=T0))
        tx.tokens.add(first)
        tx.tokens.add(second)
        tx.tokens.add(a_token("grace", "3" * 64))
    with store.read() as tx:
        assert tx.tokens.by_digest("1" * 64) == first
        assert tx.tokens.get(second.id) == second
        assert tx.tokens.by_digest("0" * 64) is None
        assert ids_of_tokens(tx.tokens.of_user("ada")) == [second.id, first.id]
        assert tx.tokens.of_user("nobody") == []


def test_a_token_is_revoked_once_and_stays_readable(store: Store) -> None:
    token = a_token("ada", "1" * 64)
    with store.write() as tx:
        tx.users.add(User(name="ada", password_hash=None, created_at=T0))
        tx.tokens.add(token)
    with store.write() as tx:
        assert tx.tokens.revoke(token.id, at(60)) is True
        assert tx.tokens.revoke(token.id, at(120)) is False
        assert tx.tokens.revoke("tok_nothere", at(120)) is False
    with store.read() as tx:
        assert tx.tokens.by_digest("1" * 64) == dataclasses.replace(token, revoked_at=at(60))


def test_a_token_needs_an_existing_user_and_an_unused_digest(store: Store) -> None:
    with pytest.raises(MissingReference), store.write() as tx:
        tx.tokens.add(a_token("nobody", "1" * 64))
    with store.write() as tx:
        tx.users.add(User(name="ada", password_hash=None, created_at=T0))
        tx.tokens.add(a_token("ada", "1" * 64))
    with pytest.raises(DuplicateKey) as raised, store.write() as tx:
        tx.tokens.add(a_token("ada", "1" * 64))
    assert raised.value.field == "digest"


# tasks


def test_a_task_reads_back_as_it_was_inserted(store: Store) -> None:
    task = a_task(idempotency_key="k1", request_digest="r" * 64)
    insert(store, task)
    with store.read() as tx:
        assert tx.tasks.get(task.id) == task
        assert tx.tasks.find_by_key("ada", "k1") == task
        assert tx.tasks.find_by_key("grace", "k1") is None
        assert tx.tasks.get("task_nothere") is None


def test_tasks_list_newest_first_in_pages_joined_by_the_after_cursor(store: Store) -> None:
    tasks = [a_task() for _ in range(5)]
    insert(store, *tasks)
    newest_first = ids(tasks[::-1])
    with store.read() as tx:
        first = tx.tasks.page("ada", "open", 2, None)
        second = tx.tasks.page("ada", "open", 2, first[-1].id)
        third = tx.tasks.page("ada", "open", 2, second[-1].id)
        assert ids(first) + ids(second) + ids(third) == newest_first
        assert tx.tasks.page("ada", "open", 2, third[-1].id) == []
        assert tx.tasks.page("ada", "open", 0, None) == []


def test_tasks_list_filters_by_status_and_by_owner_or_lists_every_owner(store: Store) -> None:
    open_ada = a_task()
    closed_ada = a_task(status="closed", closed_at=at(10), close_reason="closed")
    open_grace = a_task("grace")
    insert(store, open_ada, closed_ada, open_grace)
    with store.read() as tx:
        assert ids(tx.tasks.page("ada", "open", 10, None)) == [open_ada.id]
        assert ids(tx.tasks.page("ada", "closed", 10, None)) == [closed_ada.id]
        assert ids(tx.tasks.page("ada", "all", 10, None)) == [closed_ada.id, open_ada.id]
        assert ids(tx.tasks.page(None, "open", 10, None)) == [open_grace.id, open_ada.id]
        assert ids(tx.tasks.page(None, "all", 10, open_grace.id)) == [closed_ada.id, open_ada.id]
        with pytest.raises(ValueError, match="status"):
            tx.tasks.page("ada", "sleeping", 10, None)


def test_an_after_cursor_that_names_no_task_gives_an_empty_page(store: Store) -> None:
    insert(store, a_task())
    with store.read() as tx:
        assert tx.tasks.page("ada", "all", 10, "task_nothere") == []


def test_open_tasks_and_recent_creations_are_counted_per_owner(store: Store) -> None:
    insert(
        store,
        a_task(created_at=at(-7200)),
        a_task(created_at=at(-60)),
        a_task(created_at=at(-30), status="closed", closed_at=at(-1), close_reason="idle"),
        a_task("grace", created_at=at(-10)),
    )
    with store.read() as tx:
        assert tx.tasks.count_open("ada") == 2
        assert tx.rates.window("tasks", "ada", at(-3600)) == RateWindow(2, at(-60))
        assert tx.rates.window("tasks", "ada", at(-60)) == RateWindow(2, at(-60))
        assert tx.rates.window("tasks", "ada", at(0)) == RateWindow(0, None)
        assert tx.rates.window("tasks", "nobody", at(-3600)) == RateWindow(0, None)
        assert tx.tasks.count_open("nobody") == 0


def next_gen(task: Task, **changes: Any) -> Task:
    """The task one lease generation on, with ``changes``: what a transition answers."""
    return dataclasses.replace(task, lease_gen=task.lease_gen + 1, **changes)


def test_saving_a_task_wins_at_the_expected_generation_and_moves_it_on(store: Store) -> None:
    task = a_task(lease_gen=3)
    insert(store, task)
    new = next_gen(task, holder="api:ci", secret_digest="b" * 64, held_since=at(5))
    with store.write() as tx:
        assert tx.tasks.save(new, expected_gen=3) is True
    with store.read() as tx:
        assert tx.tasks.get(task.id) == new
        assert new.lease_gen == 4


def test_saving_a_task_at_a_stale_generation_changes_nothing(store: Store) -> None:
    task = a_task()
    insert(store, task)
    first, second = next_gen(task, holder="mcp:first"), next_gen(task, holder="mcp:second")
    with store.write() as tx:
        assert tx.tasks.save(first, expected_gen=0) is True
    with store.write() as tx:
        assert tx.tasks.save(second, expected_gen=0) is False
        assert tx.tasks.save(dataclasses.replace(second, id="task_nothere"), 0) is False
    with store.read() as tx:
        assert tx.tasks.get(task.id) == first


def test_saving_a_task_moves_the_generation_by_one_and_never_changes_its_identity(
        store: Store) -> None:
    task = a_task(idempotency_key="k1", request_digest="r" * 64)
    insert(store, task)
    with store.write() as tx:
        for gen in (0, 2, 9):
            with pytest.raises(ValueError, match="lease generation"):
                tx.tasks.save(dataclasses.replace(task, lease_gen=gen), expected_gen=0)
        other_identity = next_gen(task, owner="grace", name="renamed", created_at=at(9),
                                  idempotency_key="k2", request_digest=None, holder="mcp:new")
        assert tx.tasks.save(other_identity, expected_gen=0) is True
    with store.read() as tx:
        assert tx.tasks.get(task.id) == next_gen(task, holder="mcp:new")


def test_a_close_keeps_a_touch_that_landed_between_its_read_and_its_save(
        store: Store, store_kind: str) -> None:
    if store_kind != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing lands between")
    task = a_task(lease_gen=1, last_activity_at=at(0))
    insert(store, task)
    with store.write() as sweep:
        (due,) = sweep.tasks.due_idle(at(10), 10)  # read without a lock, as the sweep does
        with store.write() as agent:
            assert agent.tasks.touch(task.id, now=at(20), not_after=at(10))
        closed, _ = due.closed("sweep", "idle", at(30), [])
        assert sweep.tasks.save(closed, expected_gen=1)  # a touch moves no generation
    with store.read() as tx:
        assert tx.tasks.get(task.id) == dataclasses.replace(closed, last_activity_at=at(20))


def test_each_lease_and_close_transition_saves_and_reads_back_as_the_domain_made_it(
        store: Store) -> None:
    task = a_task(lease_gen=1)
    insert(store, task)
    steps = [
        lambda t: t.taken_over("api:ci", "b" * 64, at(1), {"takeover": True}),
        lambda t: t.released("api:ci", at(2)),
        lambda t: t.attached("mcp:cursor", "c" * 64, at(3), {"takeover": False}),
        lambda t: t.closed("sweep", "idle", at(4), ["vm_abcdefgh"], {"quiet_s": 1}),
    ]
    current = task
    for step in steps:
        new, event = step(current)
        with store.write() as tx:
            assert tx.tasks.save(new, expected_gen=current.lease_gen) is True
            tx.events.add(event)
        with store.read() as tx:
            assert tx.tasks.get(task.id) == new
        current = new
    with store.read() as tx:
        logged = tx.events.page(task.id, 0, 10)
    assert [e.type for e in logged] == ["taken_over", "released", "attached", "closed"]
    assert current.status == "closed" and current.close_reason == "idle"
    assert current.holder is None and current.secret_digest is None
    assert current.closed_at == at(4) and current.lease_gen == 5


def test_touch_task_moves_the_clock_only_once_per_step(store: Store) -> None:
    task = a_task()
    insert(store, task)
    with store.write() as tx:
        assert tx.tasks.touch(task.id, now=at(61), not_after=at(1)) is True
        assert tx.tasks.touch(task.id, now=at(62), not_after=at(2)) is False
        assert tx.tasks.touch(task.id, now=at(61), not_after=at(61)) is True
    with store.read() as tx:
        touched = tx.tasks.get(task.id)
    assert touched == dataclasses.replace(task, last_activity_at=at(61))


def test_touch_task_leaves_a_closed_task_alone(store: Store) -> None:
    task = a_task(status="closed", closed_at=at(1), close_reason="closed")
    insert(store, task)
    with store.write() as tx:
        assert tx.tasks.touch(task.id, now=at(100), not_after=at(50)) is False
        assert tx.tasks.touch("task_nothere", now=at(100), not_after=at(50)) is False


def test_due_idle_tasks_are_open_tasks_at_or_before_the_cutoff_quietest_first(
    store: Store,
) -> None:
    due_late = a_task(last_activity_at=at(-10))
    due_early = a_task("grace", last_activity_at=at(-20))
    due_exactly = a_task(last_activity_at=at(0))
    not_yet = a_task(last_activity_at=at(1))
    closed = a_task(last_activity_at=at(-30), status="closed", closed_at=at(-5),
                    close_reason="closed")
    insert(store, due_late, due_early, due_exactly, not_yet, closed)
    with store.read() as tx:
        assert ids(tx.tasks.due_idle(at(0), 10)) == [due_early.id, due_late.id, due_exactly.id]
        assert ids(tx.tasks.due_idle(at(0), 2)) == [due_early.id, due_late.id]
        assert tx.tasks.due_idle(at(-100), 10) == []


def test_purge_removes_long_closed_tasks_with_their_vms_events_and_execs(
        store: Store) -> None:
    old = a_task(status="closed", closed_at=at(-100), close_reason="idle")
    recent = a_task(status="closed", closed_at=at(0), close_reason="closed")
    still_open = a_task()
    insert(store, old, recent, still_open)
    with store.write() as tx:
        for task in (old, recent, still_open):
            vm = a_vm(task, status="destroyed", destroyed_at=at(-1))
            tx.vms.add(vm)
            tx.events.add(NewEvent(task_id=task.id, type="opened", at=T0, actor="mcp:x"))
            tx.execs.add(an_exec(vm, status="lost", ended_at=at(-1)))
    with store.write() as tx:
        assert tx.tasks.purge_closed_before(at(0), 10) == [old.id]
        assert tx.tasks.purge_closed_before(at(0), 10) == []
    with store.read() as tx:
        assert tx.tasks.get(old.id) is None
        assert tx.vms.of_task(old.id) == []
        assert tx.events.page(old.id, 0, 10) == []
        assert tx.execs.of_task(old.id) == []
        assert len(tx.execs.of_task(recent.id)) == 1
        assert len(tx.execs.of_task(still_open.id)) == 1
        assert tx.tasks.get(recent.id) is not None
        assert len(tx.vms.of_task(recent.id)) == 1
        assert len(tx.events.page(still_open.id, 0, 10)) == 1


def test_purge_takes_at_most_limit_tasks_the_longest_closed_first(store: Store) -> None:
    tasks = [a_task(status="closed", closed_at=at(-s), close_reason="idle") for s in (1, 3, 2)]
    insert(store, *tasks)
    with store.write() as tx:
        assert tx.tasks.purge_closed_before(at(0), 2) == [tasks[1].id, tasks[2].id]


# execs


def test_an_exec_is_added_read_and_listed_by_task_vm_and_status(store: Store) -> None:
    task, other = a_task(), a_task()
    vm, vm2, their_vm = a_vm(task), a_vm(task, name="db"), a_vm(other)
    insert(store, task, other, vm, vm2, their_vm)
    first = an_exec(vm, started_at=at(1), command="x" * 65536)
    second = an_exec(vm2, started_at=at(2))
    ended = an_exec(vm, started_at=at(0), status="exited", exit_code=0, ended_at=at(3),
                    duration_ms=3000, stdout_bytes=2**40, stderr_bytes=1)
    theirs = an_exec(their_vm, started_at=at(-5))
    with store.write() as tx:
        for ex in (first, second, ended, theirs):
            tx.execs.add(ex)
        with pytest.raises(DuplicateKey):
            tx.execs.add(first)
    with store.write() as tx, pytest.raises(MissingReference) as no_task:
        tx.execs.add(an_exec(a_vm(a_task())))  # no such task (nor VM)
    with store.write() as tx, pytest.raises(MissingReference) as no_vm:
        tx.execs.add(an_exec(a_vm(task)))  # the task is there, the VM is not
    assert (no_task.value.field, no_vm.value.field) == ("task_id", "vm_id")
    with store.read() as tx:
        assert tx.execs.get(first.id) == first and tx.execs.get(ended.id) == ended
        assert tx.execs.get("exec_aaaaaaaa") is None
        assert ids(tx.execs.of_task(task.id)) == [ended.id, first.id, second.id]
        assert ids(tx.execs.of_task(task.id, vm2.id)) == [second.id]
        assert tx.execs.of_task(task.id, their_vm.id) == []  # another task's VM
        assert ids(tx.execs.of_task(task.id, running_only=True)) == [first.id, second.id]
        in_order = sorted([first.id, second.id, theirs.id])
        assert ids(tx.execs.running(2)) == in_order[:2]
        assert ids(tx.execs.running(2, after=in_order[0])) == in_order[1:]
        assert tx.execs.running(2, after=in_order[2]) == []
        assert tx.execs.count_running([task.id, other.id, "task_none0000"]) == \
            {task.id: 2, other.id: 1, "task_none0000": 0}
        assert tx.execs.count_running([]) == {}


def test_an_exec_ends_once_and_its_totals_only_grow_while_it_runs(store: Store) -> None:
    task = a_task()
    vm = a_vm(task, status="running")
    insert(store, task, vm)
    ex, big = an_exec(vm), an_exec(vm)
    with store.write() as tx:
        tx.execs.add(ex)
        tx.execs.add(big)
        assert tx.execs.seen(ex.id, 10, 3)
        assert tx.execs.seen(ex.id, 5, 7)  # an older look: stdout stays at 10
        current = tx.execs.get(ex.id)
        assert current is not None and (current.stdout_bytes, current.stderr_bytes) == (10, 7)
        assert tx.execs.seen(big.id, 2**40, 2**33)  # past 32 bits
        assert tx.execs.seen(big.id, 2**40 - 1, 0)
        assert not tx.execs.seen("exec_aaaaaaaa", 1, 1)  # no such exec
        killed, _ = current.ended(ExecEnd("killed", at(9), signal="TERM", duration_ms=9000,
                                          totals=(12, 7)), "sweep", at(9))
        assert tx.execs.save(killed, current)
        lost, _ = current.ended(ExecEnd("lost", at(10)), "sweep", at(10))
        assert not tx.execs.save(lost, current)  # ended already: the row left `running`
        assert not tx.execs.seen(ex.id, 99, 99)
        gone = an_exec(vm)  # no such exec
        assert not tx.execs.save(gone.ended(ExecEnd("lost", at(9)), "sweep", at(9))[0], gone)
        with pytest.raises(ValueError):
            tx.execs.save(dataclasses.replace(killed, id=big.id), killed)  # another exec
    with store.read() as tx:
        assert tx.execs.get(ex.id) == dataclasses.replace(
            ex, status="killed", ended_at=at(9), signal="TERM", stdout_bytes=12,
            stderr_bytes=7, duration_ms=9000)
        assert tx.execs.get(big.id) == dataclasses.replace(big, stdout_bytes=2**40,
                                                           stderr_bytes=2**33)
        with pytest.raises(ReadOnlyTransaction):
            tx.execs.seen(ex.id, 1, 1)  # a read transaction writes nothing


def test_an_exec_end_is_saved_on_its_status_keeping_totals_seen_since_its_read(
        store: Store) -> None:
    task = a_task()
    vm = a_vm(task, status="running")
    insert(store, task, vm)
    ex = an_exec(vm)
    with store.write() as tx:
        tx.execs.add(ex)
    with store.write() as tx:
        current = tx.execs.get(ex.id)
        assert current == ex
        assert tx.execs.seen(ex.id, 50, 5)  # the guest said more after the read
        lost, _ = current.ended(ExecEnd("lost", at(9)), "sweep", at(9))
        assert tx.execs.save(lost, current) is True
    with store.read() as tx:
        assert tx.execs.get(ex.id) == dataclasses.replace(
            ex, status="lost", ended_at=at(9), stdout_bytes=50, stderr_bytes=5)


# VMs


def test_a_vm_reads_back_and_lists_under_its_task_in_creation_order(store: Store) -> None:
    task = a_task()
    first = a_vm(task, idempotency_key="v1", request_digest="r" * 64)
    second = a_vm(task, name="db", status="running", ready_at=at(3), ssh_host="127.0.0.1",
                  ssh_port=40022)
    insert(store, task, first, second)
    with store.read() as tx:
        assert tx.vms.get(second.id) == second
        assert tx.vms.get("vm_nothere") is None
        assert tx.vms.find_by_key("ada", "v1") == first
        assert tx.vms.find_by_key("grace", "v1") is None
        assert tx.vms.of_task(task.id) == [first, second]
        assert tx.vms.count_live(task.id) == 2


def test_a_vm_of_no_task_is_a_missing_reference(store: Store) -> None:
    with pytest.raises(MissingReference) as raised, store.write() as tx:
        tx.vms.add(a_vm(a_task()))
    assert (raised.value.table, raised.value.field) == ("vms", "task_id")


def test_saving_a_vm_transition_is_a_compare_and_set_on_its_status(store: Store) -> None:
    task = a_task()
    vm = a_vm(task)
    insert(store, task, vm)
    with store.write() as tx:
        started, _ = vm.running(("boot", 900), "mcp:a", at(2))
        assert tx.vms.save(started, vm) is True
        late, _ = vm.failed("late", "mcp:a", at(3))
        assert tx.vms.save(late, vm) is False  # the row left `creating`
        destroyed, _ = started.destroyed("mcp:a", at(9))
        assert tx.vms.save(destroyed, started) is True
        ghost = dataclasses.replace(vm, id="vm_nothere")
        assert tx.vms.save(ghost.failed("gone", "mcp:a", at(1))[0], ghost) is False
        with pytest.raises(ValueError, match="keeps its id"):
            tx.vms.save(dataclasses.replace(vm, id=new_vm_id()), vm)
    with store.read() as tx:
        assert tx.vms.get(vm.id) == dataclasses.replace(
            vm, status="destroyed", ready_at=at(2), destroyed_at=at(9), start_kind="boot",
            start_ms=900)
        assert tx.vms.count_live(task.id) == 0


def test_a_vm_change_is_saved_only_from_the_change_it_was_read_with(store: Store) -> None:
    task = a_task()
    vm = a_vm(task, status="running", ready_at=at(1))
    insert(store, task, vm)
    with store.write() as tx:
        pausing = vm.changing("pausing", at(2))
        assert tx.vms.save(pausing, vm) is True
        assert tx.vms.save(vm.changing("snapshotting", at(3)), vm) is False
        paused, _ = pausing.paused("mcp:a", at(4))
        assert tx.vms.save(paused, pausing) is True
        assert tx.vms.save(pausing.change_ended(), pausing) is False  # it is paused now
        assert tx.vms.save(paused, paused) is True  # no change: the row is still so
    with store.read() as tx:
        assert tx.vms.get(vm.id) == paused
        assert paused.change is None and paused.change_at is None


def test_usage_figures_are_recorded_only_while_a_vm_runs(store: Store) -> None:
    task = a_task()
    running = a_vm(task, status="running", ready_at=at(1))
    failed = a_vm(task, status="failed", error="lost")
    insert(store, task, running, failed)
    with store.write() as tx:
        assert tx.vms.record_stats(running.id, '{"cpu": 1}') is True
        assert tx.vms.record_stats(failed.id, '{"cpu": 1}') is False
    with store.read() as tx:
        got = tx.vms.get(running.id)
        assert got == dataclasses.replace(running, stats='{"cpu": 1}')
        assert tx.vms.get(failed.id) == failed


def test_a_snapshot_transition_is_a_compare_and_set_on_its_state(store: Store) -> None:
    task = a_task()
    vm = a_vm(task, status="running")
    snap = Snapshot(id="snap_abcdefgh", task_id=task.id, vm_id=vm.id, owner=task.owner,
                    name="s", host="local", image="tiny", vcpus=1, memory_mib=256,
                    disk_gib=10, state="making", created_at=T0)
    insert(store, task, vm)
    with store.write() as tx:
        tx.snapshots.add(snap)
        made, _ = snap.made(4096, "ssh-ed25519 AAAA", "mcp:a", at(1))
        assert tx.snapshots.save(made, snap) is True
        assert tx.snapshots.save(made, snap) is False  # the row left `making`
        assert tx.snapshots.remove(snap) is False
        deleting, _ = made.deleting("mcp:a", at(2))
        assert tx.snapshots.save(deleting, made) is True
        assert tx.snapshots.get(snap.id) == deleting
        assert tx.snapshots.remove(made) is False
        assert tx.snapshots.remove(deleting.removed()) is True
        assert tx.snapshots.get(snap.id) is None


def test_a_pool_vm_transition_is_a_compare_and_set_on_its_state(store: Store) -> None:
    pool = Pool(id="pool_abcdefgh", image="tiny", host=None, vcpus=1, memory_mib=256,
                running=1, saved=0, created_at=T0)
    pvm = PoolVm(id=new_vm_id(), pool_id=pool.id, goal="running", state="starting",
                 host="local", image="tiny", vcpus=1, memory_mib=256, key_id=pool.id,
                 mark="m", created_at=T0, ssh_port=40022)
    with store.write() as tx:
        tx.pools.add(pool)
        tx.pool_vms.add(pvm)
        ready = pvm.settled("ssh-ed25519 AAAA", at(1))
        assert tx.pool_vms.save(ready, pvm) is True
        assert tx.pool_vms.save(pvm.destroying(), pvm) is False  # the row left `starting`
        assert tx.pool_vms.take(pvm) is False
        assert tx.pool_vms.get(pvm.id, lock=True) == ready
        assert tx.pool_vms.take(ready.handed_out()) is True
        assert tx.pool_vms.take(ready.handed_out()) is False  # one caller takes it
        assert tx.pool_vms.get(pvm.id) is None


def test_a_pool_change_is_a_compare_and_set_on_the_columns_it_moves(store: Store) -> None:
    pool = Pool(id="pool_abcdefgh", image="tiny", host=None, vcpus=1, memory_mib=256,
                running=1, saved=0, created_at=T0)
    with store.write() as tx:
        tx.pools.add(pool)
    with store.write() as tx:
        assert tx.pools.get(pool.id, lock=True) == pool
        claimed = pool.fill_claimed("replica-a", at(0), at(60))
        assert tx.pools.save(claimed, pool) is True
        # Replica b read it free as well: its claim is refused, a holds it.
        assert tx.pools.save(pool.fill_claimed("replica-b", at(0), at(60)), pool) is False
        failed = claimed.start_failed("no room", at(1))
        assert tx.pools.save(failed, claimed) is True
        resized = failed.resized(2, 1)
        assert tx.pools.save(resized, failed) is True
        released = resized.fill_released()
        assert tx.pools.save(released, resized) is True
        assert tx.pools.get(pool.id) == dataclasses.replace(pool, running=2, saved=1)
        assert tx.pools.save(released.emptied(), released) is True
        gone = dataclasses.replace(pool, id="pool_nothere0")
        assert tx.pools.save(gone.emptied(), gone) is False
        assert tx.pools.delete(pool.id) is True
        assert tx.pools.get(pool.id) is None


def test_a_destroy_request_round_trips_and_is_set_only_on_a_destroyable_status(
        store: Store) -> None:
    task = a_task()
    vm = a_vm(task, status="running")
    asked_before = a_vm(task, status="failed", destroy_requested_at=at(1))
    insert(store, task, vm, asked_before)
    with store.read() as tx:
        assert tx.vms.get(vm.id) == vm and vm.destroy_requested_at is None
        assert tx.vms.get(asked_before.id) == asked_before
    asked = datetime(2026, 1, 1, 14, 0, 0, 123_456, tzinfo=timezone(timedelta(hours=2)))
    with store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        assert current == vm
        assert tx.vms.save(vm.destroy_requested(asked), vm) is True
        gone = dataclasses.replace(vm, status="destroyed")
        assert tx.vms.save(dataclasses.replace(gone, destroy_requested_at=at(5)), gone) is False
    with store.read() as tx:
        got = tx.vms.get(vm.id)
        assert got == dataclasses.replace(vm, destroy_requested_at=asked)
        assert got is not None and got.destroy_requested_at is not None
        assert got.destroy_requested_at.tzinfo is not None
        assert got.destroy_requested_at.utcoffset() == timedelta(0)
        assert got.status == "running" and got.is_live  # a request alone changes no status
        assert [v.id for v in tx.fleet.live_on_host("local")] == [vm.id]


def test_a_vms_disk_size_and_start_round_trip_and_the_start_is_set_when_it_runs(
        store: Store) -> None:
    task = a_task()
    vm = a_vm(task, disk_gib=1024)
    insert(store, task, vm)
    with store.read() as tx:
        got = tx.vms.get(vm.id)
        assert got == vm and got is not None
        assert (got.disk_gib, got.start_kind, got.start_ms) == (1024, None, None)
    with store.write() as tx:
        started, _ = vm.running(("pool", 2250), "mcp:a", at(2))
        assert tx.vms.save(started, vm) is True
    with store.read() as tx:
        assert tx.vms.get(vm.id) == dataclasses.replace(
            vm, status="running", ready_at=at(2), start_kind="pool", start_ms=2250)


def test_vms_of_many_tasks_come_in_one_answer_with_every_task_asked(store: Store) -> None:
    one, two, empty = a_task(), a_task(), a_task()
    vms = [a_vm(one), a_vm(two), a_vm(one)]
    insert(store, one, two, empty, *vms)
    with store.read() as tx:
        found = tx.vms.of_tasks([one.id, two.id, empty.id])
        assert tx.vms.of_tasks([]) == {}
    assert found == {one.id: [vms[0], vms[2]], two.id: [vms[1]], empty.id: []}


def test_live_vms_of_closed_tasks_are_found_for_the_sweep(store: Store) -> None:
    closed = a_task(status="closed", closed_at=at(5), close_reason="closed")
    still_open = a_task()
    leftover = [a_vm(closed), a_vm(closed, status="running")]
    insert(store, closed, still_open, *leftover, a_vm(closed, status="destroyed"),
           a_vm(closed, status="failed"), a_vm(still_open))
    with store.read() as tx:
        assert tx.fleet.live_of_closed_tasks(10) == leftover
        assert tx.fleet.live_of_closed_tasks(1) == leftover[:1]


def test_host_usage_sums_live_vms_by_host(store: Store) -> None:
    task = a_task()
    insert(
        store, task,
        a_vm(task, vcpus=2, memory_mib=512),
        a_vm(task, status="running", vcpus=1, memory_mib=256),
        a_vm(task, host="big", status="running", vcpus=4, memory_mib=4096),
        a_vm(task, host="big", status="destroyed", vcpus=8, memory_mib=8192),
        a_vm(task, host="gone", status="failed"),
    )
    with store.read() as tx:
        assert tx.fleet.usage_by_host() == {
            "local": HostUsage(vcpus=3, memory_mib=768, vms=2),
            "big": HostUsage(vcpus=4, memory_mib=4096, vms=1),
        }


def test_a_sleeping_vm_holds_no_room_and_a_waking_one_does(store: Store) -> None:
    task = a_task()
    insert(store, task, a_vm(task, status="sleeping", memory_mib=4096),
           a_vm(task, status="sleeping", change="waking", memory_mib=512),
           a_vm(task, status="running", change="falling_asleep", memory_mib=256))
    with store.read() as tx:
        assert tx.fleet.usage_by_host() == {"local": HostUsage(vcpus=2, memory_mib=768, vms=2)}


def test_sleep_candidates_are_running_vms_of_open_tasks_quiet_past_their_cutoff(
        store: Store) -> None:
    quiet = a_task(last_activity_at=at(0))
    own_time = a_task(last_activity_at=at(50), sleep_after_s=60)
    busy = a_task(last_activity_at=at(200))
    never = a_task(last_activity_at=at(0), sleep_after_s=0)
    closed = a_task(last_activity_at=at(0), status="closed")
    due = [a_vm(quiet, status="running"), a_vm(own_time, status="running")]
    insert(store, quiet, own_time, busy, never, closed, *due,
           a_vm(quiet, status="sleeping"), a_vm(quiet, status="running", change="pausing"),
           a_vm(busy, status="running"), a_vm(never, status="running"),
           a_vm(closed, status="running"))
    with store.read() as tx:
        assert tx.fleet.sleep_candidates(at(100), at(100), 10) == due
        assert tx.fleet.sleep_candidates(at(100), at(100), 1) == due[:1]
        assert tx.fleet.sleep_candidates(None, at(100), 10) == due[1:]  # RIFT_TASK_SLEEP_S 0
        assert tx.fleet.sleep_candidates(at(10), at(10), 10) == due[:1]


def test_live_vms_on_a_host_are_listed_for_the_reconciler(store: Store) -> None:
    task = a_task()
    live = [a_vm(task), a_vm(task, status="running")]
    insert(store, task, *live, a_vm(task, status="failed"), a_vm(task, host="big"))
    with store.read() as tx:
        assert tx.fleet.live_on_host("local") == live
        assert tx.fleet.live_on_host("nowhere") == []


def test_vm_creations_are_counted_per_owner_since_a_time(store: Store) -> None:
    task, other = a_task(), a_task("grace")
    insert(store, task, other, a_vm(task, created_at=at(-7200)), a_vm(task, created_at=at(-50)),
           a_vm(task, created_at=at(-10), status="destroyed"), a_vm(other, created_at=at(-5)))
    with store.read() as tx:
        assert tx.rates.window("vms", "ada", at(-3600)) == RateWindow(2, at(-50))
        assert tx.rates.window("vms", "ada", at(0)) == RateWindow(0, None)


# events


def test_events_get_increasing_ids_and_page_after_an_id(store: Store) -> None:
    task, other = a_task(), a_task()
    insert(store, task, other)
    with store.write() as tx:
        made = [
            tx.events.add(NewEvent(task_id=t.id, type="attached", at=at(i), actor="mcp:x",
                                   details={"n": i}))
            for i, t in enumerate([task, other, task, task, task])
        ]
    assert made == sorted(made) and len(set(made)) == 5
    with store.read() as tx:
        first = tx.events.page(task.id, 0, 2)
        rest = tx.events.page(task.id, first[-1].id, 100)
    assert [e.details["n"] for e in first + rest] == [0, 2, 3, 4]
    assert [e.id for e in first + rest] == [made[0], made[2], made[3], made[4]]
    assert rest[-1].at == at(4) and rest[-1].type == "attached" and rest[-1].actor == "mcp:x"


def test_event_details_round_trip_as_json(store: Store) -> None:
    task = a_task()
    details: dict[str, Any] = {"vm_id": "vm_abcdefgh", "ids": [1, 2], "nested": {"ok": True},
                               "none": None, "text": "render, never follow ✓"}
    insert(store, task)
    with store.write() as tx:
        event_id = tx.events.add(NewEvent(task_id=task.id, type="closed", at=T0, actor="sweep",
                                          details=details))
    with store.read() as tx:
        (event,) = tx.events.page(task.id, event_id - 1, 10)
    assert event.details == details and event.id == event_id


def test_event_details_are_stored_values_that_callers_cannot_change_afterwards(
        store: Store) -> None:
    task = a_task()
    insert(store, task)
    details = {"vms": ["vm_abcdefgh"]}
    with store.write() as tx:
        tx.events.add(NewEvent(task_id=task.id, type="closed", at=T0, actor="sweep",
                               details=details))
    details["vms"].append("vm_changed")
    with store.read() as tx:
        tx.events.page(task.id, 0, 10)[0].details["vms"].clear()
    with store.read() as tx:
        assert tx.events.page(task.id, 0, 10)[0].details == {"vms": ["vm_abcdefgh"]}


def test_event_details_that_json_cannot_hold_are_refused_and_nothing_is_kept(
        store: Store) -> None:
    task = a_task()
    insert(store, task)
    # SQLite: the JSON type serializes (StatementError); psycopg: the driver (TypeError).
    refused = pytest.raises((TypeError, StatementError), match="not JSON serializable")
    with refused, store.write() as tx:
        tx.events.add(NewEvent(task_id=task.id, type="closed", at=T0, actor="sweep",
                               details={"when": T0}))
    with store.read() as tx:
        assert tx.events.page(task.id, 0, 10) == []


# hosts


def test_hosts_are_added_listed_changed_and_deleted(store: Store) -> None:
    local = Host(name="local", uri="test:///default", vcpus=4, memory_mib=8192, created_at=T0)
    with store.write() as tx:
        tx.hosts.add(Host(name="big", uri="qemu+ssh://big/system", vcpus=64, memory_mib=262144))
        tx.hosts.add(local)
    with pytest.raises(DuplicateKey), store.write() as tx:
        tx.hosts.add(local)
    nowhere = dataclasses.replace(local, name="nowhere")
    with store.write() as tx:
        assert tx.hosts.get("local", lock=True) == local
        drained = local.set_drain(True)
        assert tx.hosts.save(drained, local) is True
        assert tx.hosts.save(drained.set_drain(True), drained) is True  # no change: still so
        resized = drained.resized("test:///default", 8, 8192)
        assert tx.hosts.save(resized, drained) is True
        assert tx.hosts.save(nowhere.set_drain(True), nowhere) is False
        assert tx.hosts.delete("big") is True
        assert tx.hosts.delete("big") is False
    with store.read() as tx:
        assert tx.hosts.all() == [dataclasses.replace(local, drained=True, vcpus=8)]
        assert tx.hosts.get("big") is None


def test_a_host_change_is_a_compare_and_set_on_the_columns_it_moves(store: Store) -> None:
    local = Host(name="local", uri="test:///default", vcpus=4, memory_mib=8192, created_at=T0)
    with store.write() as tx:
        tx.hosts.add(local)
    silent = local.unreachable(at(5), "connection refused")
    with store.write() as tx:
        assert tx.hosts.save(silent, local) is True
        # Another replica read it answering too: its mark is refused, the first kept.
        assert tx.hosts.save(local.unreachable(at(6), "timed out"), local) is False
        assert tx.hosts.get("local") == silent
        back = silent.reachable()
        assert tx.hosts.save(back, silent) is True
        assert tx.hosts.save(back, silent) is False  # it answers already
    with store.read() as tx:
        assert tx.hosts.get("local") == local


# transactions


def test_a_write_block_that_raises_leaves_nothing_behind(store: Store) -> None:
    kept = a_task()
    insert(store, kept)
    lost = a_task()
    with pytest.raises(RuntimeError, match="half-way"), store.write() as tx:
        tx.tasks.add(lost)
        tx.vms.add(a_vm(lost))
        tx.events.add(NewEvent(task_id=lost.id, type="opened", at=T0, actor="mcp:x"))
        assert tx.tasks.save(next_gen(kept, holder="mcp:lost"), expected_gen=0) is True
        raise RuntimeError("the use case failed half-way")
    with store.read() as tx:
        assert tx.tasks.get(lost.id) is None
        assert tx.vms.of_task(lost.id) == []
        assert tx.events.page(lost.id, 0, 10) == []
        assert tx.tasks.get(kept.id) == kept


def test_a_write_is_seen_by_other_transactions_only_once_committed(store: Store) -> None:
    task = a_task()
    with store.write() as tx:
        tx.tasks.add(task)
        with store.read() as other:
            assert other.tasks.get(task.id) is None
    with store.read() as other:
        assert other.tasks.get(task.id) == task


def test_a_read_block_refuses_changes(store: Store) -> None:
    with pytest.raises(ReadOnlyTransaction), store.read() as tx:
        tx.tasks.add(a_task())
    with store.read() as tx:
        assert tx.tasks.page(None, "all", 10, None) == []


def test_reusing_a_task_idempotency_key_is_a_duplicate_key_and_the_write_goes_on(
    store: Store,
) -> None:
    first = a_task(idempotency_key="same")
    insert(store, first, a_task("grace", idempotency_key="same"))
    with store.write() as tx:
        with pytest.raises(DuplicateKey) as raised:
            tx.tasks.add(a_task(idempotency_key="same"))
        assert (raised.value.table, raised.value.field) == ("tasks", "idempotency_key")
        assert tx.tasks.find_by_key("ada", "same") == first
        tx.tasks.add(a_task(idempotency_key="other"))
    with store.read() as tx:
        assert len(tx.tasks.page("ada", "all", 10, None)) == 2


def test_reusing_a_vm_idempotency_key_is_a_duplicate_key_and_the_write_goes_on(
    store: Store,
) -> None:
    task = a_task()
    first = a_vm(task, idempotency_key="same")
    insert(store, task, first)
    with store.write() as tx:
        with pytest.raises(DuplicateKey) as raised:
            tx.vms.add(a_vm(task, idempotency_key="same"))
        assert (raised.value.table, raised.value.field) == ("vms", "idempotency_key")
        assert tx.vms.find_by_key("ada", "same") == first
        tx.vms.add(a_vm(task))
    with store.read() as tx:
        assert len(tx.vms.of_task(task.id)) == 2


def test_rows_without_an_idempotency_key_never_clash(store: Store) -> None:
    task = a_task()
    insert(store, task, a_task(), a_vm(task), a_vm(task))
    with store.read() as tx:
        assert len(tx.tasks.page("ada", "all", 10, None)) == 2
        assert len(tx.vms.of_task(task.id)) == 2


def test_timestamps_round_trip_as_aware_utc_with_microseconds(store: Store) -> None:
    east = timezone(timedelta(hours=5, minutes=30))
    created = datetime(2026, 3, 4, 10, 11, 12, 123456, tzinfo=east)
    task = a_task(created_at=created, last_activity_at=datetime(1999, 12, 31, 23, 59, 59, 1,
                                                                 tzinfo=UTC))
    insert(store, task)
    with store.read() as tx:
        back = tx.tasks.get(task.id)
    assert back is not None
    assert back.created_at == created
    assert back.created_at.utcoffset() == timedelta(0)
    assert back.created_at.microsecond == 123456
    assert back.last_activity_at.microsecond == 1
    assert back.held_since is not None and back.held_since.tzinfo is not None


def test_naive_timestamps_are_refused(store: Store) -> None:
    with pytest.raises((ValueError, StatementError), match="naive"), store.write() as tx:
        tx.tasks.add(a_task(created_at=datetime(2026, 1, 1, 12, 0)))


def test_twenty_racing_writers_win_exactly_once_per_generation(
    store: Store, store_kind: str
) -> None:
    task = a_task(lease_gen=7)
    insert(store, task)
    racers = 20
    start = threading.Barrier(racers)

    def attach(n: int) -> tuple[int, bool, str]:
        holder = f"mcp:agent-{n}"
        start.wait(timeout=30)
        with store.write() as tx:
            seen = tx.tasks.get(task.id)
            assert seen is not None
            won = tx.tasks.save(next_gen(seen, holder=holder), expected_gen=seen.lease_gen)
        return seen.lease_gen, won, holder

    with ThreadPoolExecutor(max_workers=racers) as pool_:
        results = [f.result(timeout=120) for f in [pool_.submit(attach, n) for n in range(racers)]]

    winners = sorted((gen, holder) for gen, won, holder in results if won)
    assert [gen for gen, _ in winners] == list(range(7, 7 + len(winners)))
    if store_kind != "postgresql":
        # Writes queue on the write lock, so each writer reads the latest generation.
        assert len(winners) == racers
    with store.read() as tx:
        final = tx.tasks.get(task.id)
    assert final is not None
    assert final.lease_gen == 7 + len(winners)
    assert final.holder == winners[-1][1]


# the schema


def test_the_migrated_schema_matches_the_tables(empty_sql_url: str) -> None:
    upgrade(empty_sql_url)
    engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_migrating_again_is_harmless_and_reaches_the_head(empty_sql_url: str) -> None:
    assert current_revision(empty_sql_url) is None
    upgrade(empty_sql_url)
    upgrade(empty_sql_url)
    assert current_revision(empty_sql_url) == head_revision() == "0020"


def test_migration_0006_gives_vms_that_ran_a_boot_start_and_every_vm_ten_gib(
        empty_sql_url: str) -> None:
    """VMs made before 0006 were cold-booted with a 10 GiB overlay: the ones that ran
    start as `boot` in the time from their row to `ready_at`; the others have none."""
    from sqlalchemy import insert as sql_insert

    from rift.store.sql import SqlStore
    from rift.store.tables import tasks, vms

    upgrade(empty_sql_url, "0005")
    task = a_task()
    ran = a_vm(task, status="destroyed", ready_at=at(3.5), destroyed_at=at(9))
    never = a_vm(task, status="failed", error="libvirt said no")
    before_0006 = {"disk_gib", "start_kind", "start_ms", *AFTER_0008}
    engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(sql_insert(tasks).values(_task_row_before_0016(task)))
            for vm in (ran, never):
                row = {k: v for k, v in dataclasses.asdict(vm).items() if k not in before_0006}
                connection.execute(sql_insert(vms).values(row))
    finally:
        engine.dispose()
    upgrade(empty_sql_url)
    store = SqlStore(empty_sql_url)
    try:
        with store.read() as tx:
            assert tx.vms.get(ran.id) == dataclasses.replace(ran, start_kind="boot",
                                                             start_ms=3500)
            assert tx.vms.get(never.id) == never
            assert never.disk_gib == ran.disk_gib == 10
    finally:
        store.close()


def test_migration_0008_adds_execs_to_a_0007_database_and_takes_them_away_again(
        empty_sql_url: str) -> None:
    """A database at 0007 with tasks and VMs in it upgrades, keeps execs of its VMs,
    downgrades to 0007 (the execs go, the rest stays) and upgrades again."""
    from alembic import command
    from sqlalchemy import insert as sql_insert
    from sqlalchemy import inspect

    from rift.store.migrate import alembic_config
    from rift.store.sql import SqlStore
    from rift.store.tables import tasks, vms

    def tables() -> set[str]:
        engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
        try:
            return set(inspect(engine).get_table_names())
        finally:
            engine.dispose()

    upgrade(empty_sql_url, "0007")
    assert "execs" not in tables()
    task = a_task()
    vm = a_vm(task, status="running", ready_at=at(1))
    engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(sql_insert(tasks).values(_task_row_before_0016(task)))
            connection.execute(sql_insert(vms).values(_row_before_0009(vm)))
    finally:
        engine.dispose()
    upgrade(empty_sql_url)
    assert current_revision(empty_sql_url) == head_revision()
    ex = an_exec(vm)
    store = SqlStore(empty_sql_url)
    try:
        with store.write() as tx:
            assert tx.vms.get(vm.id) == vm
            tx.execs.add(ex)
        with store.read() as tx:
            assert tx.execs.of_task(task.id) == [ex]
    finally:
        store.close()
    command.downgrade(alembic_config(empty_sql_url), "0007")
    assert current_revision(empty_sql_url) == "0007"
    assert "execs" not in tables() and {"tasks", "vms", "pools"} <= tables()
    upgrade(empty_sql_url)
    store = SqlStore(empty_sql_url)
    try:
        with store.read() as tx:
            assert tx.vms.get(vm.id) == vm
            assert tx.execs.of_task(task.id) == []
    finally:
        store.close()


def test_counts_across_users_see_open_tasks_and_vms_by_status(store: Store) -> None:
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    with store.write() as tx:
        for owner in ("ann", "ben"):
            task_id = new_task_id()
            tx.tasks.add(Task(id=task_id, owner=owner, name="t", status="open", lease_gen=1,
                              secret_digest=None, holder=None, held_since=None,
                              last_activity_at=now, created_at=now))
        tx.vms.add(Vm(id=new_vm_id(), task_id=task_id, owner="ben", name="v", image="tiny",
                      status="running", host="local", vcpus=1, memory_mib=64, created_at=now))
    with store.read() as tx:
        assert tx.tasks.count_open(None) == 2
        assert tx.fleet.count_by_status("running") == 1
        assert tx.fleet.count_by_status("failed") == 0


def test_the_installation_has_an_id_and_meta_is_compare_and_set(store: Store) -> None:
    with store.read() as tx:
        install = tx.meta.get("install_id")
    assert install is not None and install.startswith("rift_")
    with store.write() as tx:
        assert tx.meta.swap("heartbeat_at", None, "a")
        assert not tx.meta.swap("heartbeat_at", None, "b")  # present: no longer absent
        assert not tx.meta.swap("heartbeat_at", "stale", "c")
        assert tx.meta.swap("heartbeat_at", "a", "d")
    with store.read() as tx:
        assert tx.meta.get("heartbeat_at") == "d"


AFTER_0008 = ("change", "change_at", "egress", "stats",  # VM fields of 0009, 0012, 0013
              "woke_ms")  # and 0016
TASK_AFTER_0015 = ("sleep_after_s", "sleep")  # task fields of 0016


def _task_row_before_0016(task: Task) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(task).items() if k not in TASK_AFTER_0015}


def _row_before_0009(vm: Vm) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(vm).items() if k not in AFTER_0008}


def test_migration_0009_adds_vm_changes_and_its_downgrade_keeps_paused_vms_live(
        empty_sql_url: str) -> None:
    """A 0008 database's VMs upgrade with no change under way; a paused VM pausing
    again downgrades as a running one (reconciliation then judges its domain)."""
    from alembic import command
    from sqlalchemy import insert as sql_insert
    from sqlalchemy import select as sql_select

    from rift.store.migrate import alembic_config
    from rift.store.sql import SqlStore
    from rift.store.tables import tasks, vms

    upgrade(empty_sql_url, "0008")
    task = a_task()
    vm = a_vm(task, status="running", ready_at=at(1))
    engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(sql_insert(tasks).values(_task_row_before_0016(task)))
            connection.execute(sql_insert(vms).values(_row_before_0009(vm)))
    finally:
        engine.dispose()
    upgrade(empty_sql_url)
    store = SqlStore(empty_sql_url)
    try:
        with store.write() as tx:
            assert tx.vms.get(vm.id) == vm and vm.change is None
            assert tx.vms.save(dataclasses.replace(vm, status="paused"), vm)
    finally:
        store.close()
    command.downgrade(alembic_config(empty_sql_url), "0008")
    engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            assert connection.execute(sql_select(vms.c.status)).scalars().all() == ["running"]
    finally:
        engine.dispose()
    upgrade(empty_sql_url)
    assert current_revision(empty_sql_url) == head_revision()


def test_migration_0014_leaves_tokens_made_before_it_no_operators(empty_sql_url: str) -> None:
    """A token made before 0014 reads /metrics as any token does; only one made
    with `--operator` afterwards is an operator's, and it stays one."""
    from sqlalchemy import insert as sql_insert

    from rift.store.sql import SqlStore
    from rift.store.tables import api_tokens, users

    upgrade(empty_sql_url, "0013")
    old = a_token("ada", "a" * 64)
    engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(sql_insert(users).values(
                dataclasses.asdict(User("ada", None, T0))))
            row = {k: v for k, v in dataclasses.asdict(old).items() if k != "operator"}
            connection.execute(sql_insert(api_tokens).values(row))
    finally:
        engine.dispose()
    upgrade(empty_sql_url)
    made = dataclasses.replace(a_token("ada", "b" * 64), operator=True)
    store = SqlStore(empty_sql_url)
    try:
        with store.write() as tx:
            tx.tokens.add(made)
        with store.read() as tx:
            assert tx.tokens.by_digest(old.digest) == old and old.operator is False
            assert tx.tokens.by_digest(made.digest) == made
    finally:
        store.close()


def test_migration_0016_gives_tasks_made_before_it_the_default_sleep(
        empty_sql_url: str) -> None:
    """A task made before 0016 sleeps after RIFT_TASK_SLEEP_S when idle; the downgrade
    takes the columns away again."""
    from alembic import command
    from sqlalchemy import insert as sql_insert

    from rift.store.migrate import alembic_config
    from rift.store.sql import SqlStore
    from rift.store.tables import tasks

    upgrade(empty_sql_url, "0015")
    task = a_task()
    engine = create_engine(empty_sql_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(sql_insert(tasks).values(_task_row_before_0016(task)))
    finally:
        engine.dispose()
    upgrade(empty_sql_url)
    store = SqlStore(empty_sql_url)
    try:
        with store.read() as tx:
            assert tx.tasks.get(task.id) == task
            assert (task.sleep_after_s, task.sleep) == (None, "idle")
    finally:
        store.close()
    command.downgrade(alembic_config(empty_sql_url), "0015")
    assert current_revision(empty_sql_url) == "0015"
    upgrade(empty_sql_url)


def test_volumes_save_by_state_keep_names_unique_per_owner_and_their_attachments(
        store: Store) -> None:
    from rift.domain.volumes import Attachment, Volume

    task = a_task()
    vm = a_vm(task)
    insert(store, task, vm)
    vol = Volume("vol_aaaaaaaa", "ada", "work", 4, "local", "making", T0)
    with store.write() as tx:
        tx.volumes.add(vol)
        with pytest.raises(DuplicateKey):
            tx.volumes.add(dataclasses.replace(vol, id="vol_bbbbbbbb"))
        tx.volumes.add(dataclasses.replace(vol, id="vol_cccccccc", owner="bob"))
        assert tx.volumes.save(vol.made(), vol)
        assert not tx.volumes.save(vol.made(), vol)  # the row left `making`
    ready = vol.made()
    att = Attachment(vol.id, vm.id, task.id, "/data", False, "vdc", "attaching", at(1))
    with store.write() as tx:
        assert tx.volumes.get(vol.id, lock=True) == ready
        assert [v.id for v in tx.volumes.of_owner("ada")] == [vol.id]
        assert tx.volumes.gib_of_owner("ada") == 4
        tx.volumes.attach(att)
        with pytest.raises(DuplicateKey):
            tx.volumes.attach(att)
        with pytest.raises(MissingReference):
            tx.volumes.attach(dataclasses.replace(att, vm_id="vm_zzzzzzzz"))
        assert tx.volumes.unsettled() == [att]  # attaching: a change under way or cut
        assert tx.volumes.save_attachment(att.attached(), att)
        assert tx.volumes.unsettled() == []
        assert not tx.volumes.save_attachment(att.attached(), att)
    with store.read() as tx:
        assert tx.volumes.holders(vol.id) == [att.attached()]
        assert tx.volumes.of_vms([vm.id, "vm_none0000"]) == {vm.id: [att.attached()],
                                                           "vm_none0000": []}
        with pytest.raises(ReadOnlyTransaction):
            tx.volumes.detach(vm.id)
    with store.write() as tx:
        assert tx.volumes.detach(vm.id) == [att.attached()]
        assert tx.volumes.holders(vol.id) == []
        assert not tx.volumes.remove(vol)  # only while in the state it names (making)
        deleting = ready.deleting()
        assert tx.volumes.save(deleting, ready)
        assert tx.volumes.remove(deleting.removed())
        assert tx.volumes.get(vol.id) is None
