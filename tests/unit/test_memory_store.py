"""What the memory store does beyond the contract: it guards against misuse
that the SQL store would only show under load."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rift.domain.ids import new_task_id
from rift.domain.model import NewEvent, Task
from rift.store.memory import MemoryStore

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def a_task() -> Task:
    return Task(id=new_task_id(), owner="ada", name="t", status="open", lease_gen=0,
                secret_digest=None, holder=None, held_since=None, last_activity_at=T0,
                created_at=T0)


def test_a_write_inside_a_write_in_one_thread_is_refused() -> None:
    store = MemoryStore()
    with store.write(), pytest.raises(RuntimeError, match=r"inside store\.write"), store.write():
        pass
    with store.write() as tx:  # the store is usable again afterwards
        tx.insert_task(a_task())


def test_event_details_are_copies_that_callers_cannot_change_in_the_store() -> None:
    store = MemoryStore()
    task = a_task()
    details = {"vms": ["vm_abcdefgh"]}
    with store.write() as tx:
        tx.insert_task(task)
        tx.add_event(NewEvent(task_id=task.id, type="closed", at=T0, actor="sweep",
                              details=details))
    details["vms"].append("vm_changed")
    with store.read() as tx:
        tx.list_events(task.id, 0, 10)[0].details["vms"].clear()
    with store.read() as tx:
        assert tx.list_events(task.id, 0, 10)[0].details == {"vms": ["vm_abcdefgh"]}


def test_event_details_that_json_cannot_hold_are_refused_as_a_database_would() -> None:
    store = MemoryStore()
    task = a_task()
    with pytest.raises(TypeError), store.write() as tx:
        tx.insert_task(task)
        tx.add_event(NewEvent(task_id=task.id, type="closed", at=T0, actor="sweep",
                              details={"when": T0}))
