"""A task's lease and close transitions: each answers the task one lease generation
on and the event that records it, and refuses what SPEC §4 refuses."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.errors import TaskClosed, TaskReleased
from rift.domain.model import NewEvent, Task

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)


def held_task(**changes: object) -> Task:
    task = Task(id="task_abcdefgh", owner="alice", name="t", status="open", lease_gen=4,
                secret_digest="a" * 64, holder="mcp:first", held_since=T0,
                last_activity_at=T0, created_at=T0)
    return replace(task, **changes)  # type: ignore[arg-type]


def test_taking_over_hands_the_lease_to_the_new_holder_and_names_the_old_one() -> None:
    task = held_task()
    new, event = task.taken_over("mcp:second", "b" * 64, LATER, {"takeover": True})
    assert new == replace(task, lease_gen=5, secret_digest="b" * 64, holder="mcp:second",
                          held_since=LATER, last_activity_at=LATER)
    assert event == NewEvent(task.id, "taken_over", LATER, "mcp:second",
                             {"previous_holder": "mcp:first", "takeover": True})


def test_attaching_a_released_task_names_no_previous_holder() -> None:
    task = held_task(secret_digest=None, holder=None, held_since=None)
    new, event = task.attached("api:ci", "c" * 64, LATER)
    assert (new.lease_gen, new.holder, new.held_since) == (5, "api:ci", LATER)
    assert event.type == "attached" and event.details == {"previous_holder": None}


def test_releasing_leaves_the_task_open_held_by_no_one() -> None:
    task = held_task()
    new, event = task.released("mcp:first", LATER)
    assert new == replace(task, lease_gen=5, secret_digest=None, holder=None, held_since=None)
    assert new.is_open and not new.is_held
    assert event == NewEvent(task.id, "released", LATER, "mcp:first", {})


def test_releasing_a_released_task_is_refused_as_task_released() -> None:
    task, _ = held_task().released("mcp:first", LATER)
    with pytest.raises(TaskReleased):
        task.released("mcp:first", LATER)


def test_closing_records_the_reason_and_the_vms_the_close_puts_away() -> None:
    task = held_task()
    new, event = task.closed("sweep", "idle", LATER, ["vm_abcdefgh"], {"quiet_s": 14400})
    assert new == replace(task, lease_gen=5, status="closed", closed_at=LATER,
                          close_reason="idle", secret_digest=None, holder=None,
                          held_since=None)
    assert event == NewEvent(task.id, "closed", LATER, "sweep",
                             {"reason": "idle", "vms": ["vm_abcdefgh"], "quiet_s": 14400})


def test_a_closed_task_refuses_every_transition_as_task_closed() -> None:
    task, _ = held_task().closed("mcp:first", "closed", LATER, [])
    for transition in (lambda: task.attached("mcp:x", "d" * 64, LATER),
                       lambda: task.taken_over("mcp:x", "d" * 64, LATER),
                       lambda: task.released("mcp:x", LATER),
                       lambda: task.closed("sweep", "idle", LATER, []),
                       lambda: task.touched(LATER)):
        with pytest.raises(TaskClosed):
            transition()


def test_a_touch_moves_the_activity_clock_and_not_the_generation() -> None:
    task = held_task()
    assert task.touched(LATER) == replace(task, last_activity_at=LATER)
