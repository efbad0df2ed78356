from dataclasses import replace
from datetime import timedelta

from rift.domain.clock import FakeClock
from rift.domain.leases import LeaseRules
from rift.domain.model import Task


def _task(clock: FakeClock, **changes: object) -> Task:
    now = clock.now()
    task = Task(id="task_abcdefgh", owner="alice", name="t", status="open", lease_gen=1,
                secret_digest="d", holder="mcp:x", held_since=now, last_activity_at=now,
                created_at=now)
    return replace(task, **changes)  # type: ignore[arg-type]


def test_the_countdowns_follow_last_activity() -> None:
    clock, rules = FakeClock(), LeaseRules()
    task = _task(clock)
    assert rules.lease_quiet_at(task) == task.last_activity_at + timedelta(seconds=1800)
    assert rules.closes_at(task) == task.last_activity_at + timedelta(seconds=14400)
    assert rules.closes_at(replace(task, status="closed")) is None


def test_a_lease_is_active_until_exactly_the_quiet_period_has_passed() -> None:
    clock, rules = FakeClock(), LeaseRules()
    task = _task(clock)
    assert rules.lease_is_active(task, clock.advance(1799))
    assert not rules.lease_is_active(task, clock.advance(1))


def test_a_released_lease_is_never_active() -> None:
    clock, rules = FakeClock(), LeaseRules()
    assert not rules.lease_is_active(_task(clock, secret_digest=None), clock.now())


def test_the_stored_clock_moves_once_per_activity_step() -> None:
    clock, rules = FakeClock(), LeaseRules(activity_step_s=60)
    task = _task(clock)
    assert not rules.needs_touch(task, clock.advance(59))
    assert rules.needs_touch(task, clock.advance(1))


def test_a_task_is_idle_at_exactly_the_idle_period_and_not_a_second_before() -> None:
    clock, rules = FakeClock(), LeaseRules()
    task = _task(clock)
    assert not rules.is_idle(task, clock.advance(14399))
    assert rules.is_idle(task, clock.advance(1))
    assert not rules.is_idle(replace(task, status="closed"), clock.now())
