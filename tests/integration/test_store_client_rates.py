"""The store's side of the client budgets (SPEC §15), against each database: exec
starts counted per owner, a task's stale-handle refusals (and no other event)
counted per task, each with the oldest's time, and a failed login counted ahead
taken back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rift.domain.ids import new_exec_id, new_task_id, new_vm_id
from rift.domain.model import Exec, NewEvent, Task, User, Vm
from rift.domain.records import RateWindow
from rift.services.ports import Store

T0 = datetime(2026, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _task_and_vm(store: Store, owner: str) -> tuple[Task, Vm]:
    task = Task(id=new_task_id(), owner=owner, name="t", status="open", lease_gen=0,
                secret_digest="a" * 64, holder="mcp:claude-code", held_since=T0,
                last_activity_at=T0, created_at=T0)
    vm = Vm(id=new_vm_id(), task_id=task.id, owner=owner, name="web", image="tiny",
            status="creating", host="local", vcpus=1, memory_mib=256, created_at=T0)
    with store.write() as tx:
        tx.tasks.add(task)
        tx.vms.add(vm)
    return task, vm


def test_exec_starts_are_counted_per_owner_since_a_time(store: Store) -> None:
    _, ada_vm = _task_and_vm(store, "ada")
    _, bob_vm = _task_and_vm(store, "bob")
    with store.write() as tx:
        for vm, second in ((ada_vm, 1), (ada_vm, 5), (ada_vm, 9), (bob_vm, 2)):
            tx.execs.add(Exec(id=new_exec_id(), task_id=vm.task_id, vm_id=vm.id,
                              owner=vm.owner, command="true", status="running",
                              timeout_s=60, started_at=at(second)))
    with store.read() as tx:
        assert tx.rates.window("execs", "ada", at(0)) == RateWindow(3, at(1))
        assert tx.rates.window("execs", "ada", at(5)) == RateWindow(2, at(5))
        assert tx.rates.window("execs", "ada", at(2)) == RateWindow(2, at(5))
        assert tx.rates.window("execs", "bob", at(0)) == RateWindow(1, at(2))
        assert tx.rates.window("execs", "carol", at(0)) == RateWindow(0, None)


def test_stale_handle_refusals_are_counted_per_task_since_a_time(store: Store) -> None:
    task, _ = _task_and_vm(store, "ada")
    other, _ = _task_and_vm(store, "ada")
    with store.write() as tx:
        for task_id, kind, second in ((task.id, "stale_rejected", 1),
                                      (task.id, "stale_rejected", 4),
                                      (task.id, "attached", 5),
                                      (other.id, "stale_rejected", 6)):
            tx.events.add(NewEvent(task_id, kind, at(second), "mcp:x", {}))
    with store.read() as tx:
        assert tx.rates.window("stale_rejected", task.id, at(0)) == RateWindow(2, at(1))
        assert tx.rates.window("stale_rejected", task.id, at(2)) == RateWindow(1, at(4))
        assert tx.rates.window("stale_rejected", other.id, at(0)) == RateWindow(1, at(6))
        assert tx.rates.window("stale_rejected", "task_nothere", at(0)) == RateWindow(0, None)


def test_a_failure_counted_ahead_is_taken_back_never_below_zero(store: Store) -> None:
    with store.write() as tx:
        tx.users.add(User(name="ada", password_hash=None, created_at=T0))
        tx.web.add_login_failure("addr:y", at(1))
        tx.web.add_login_failure("addr:y", at(2))
        tx.web.uncount_login_failure("addr:y")
    with store.read() as tx:
        found = tx.web.login_failures("addr:y")
        assert found is not None and found.failures == 1
    with store.write() as tx:
        tx.web.uncount_login_failure("addr:y")
        tx.web.uncount_login_failure("addr:y")
        tx.web.uncount_login_failure("nothing")  # no count: nothing happens
    with store.read() as tx:
        found = tx.web.login_failures("addr:y")
        assert found is not None and found.failures == 0
        assert tx.web.login_failures("nothing") is None
