"""The rules of SPEC §2's clocks (activity step, lease quiet period, idle close)
as pure functions of `now`. `now` itself comes from the `Clock` port
(rift/domain/clock.py); these are the values the rules are made of."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from rift.domain.model import Task


@dataclass(frozen=True)
class LeaseRules:
    """`RIFT_ACTIVITY_STEP_S`, `RIFT_LEASE_QUIET_S` and `RIFT_TASK_IDLE_S`, and what
    they decide about a task at a given time."""

    activity_step_s: int = 60
    lease_quiet_s: int = 1800
    task_idle_s: int = 14400

    def lease_quiet_at(self, task: Task) -> datetime:
        """When the lease stops needing `takeover` to be taken up."""
        return task.last_activity_at + timedelta(seconds=self.lease_quiet_s)

    def closes_at(self, task: Task) -> datetime | None:
        """When an open task closes itself for being quiet; None once closed."""
        if not task.is_open:
            return None
        return task.last_activity_at + timedelta(seconds=self.task_idle_s)

    def lease_is_active(self, task: Task, now: datetime) -> bool:
        """Held, and touched within the quiet period: taking it needs `takeover`."""
        return task.is_held and now < self.lease_quiet_at(task)

    def needs_touch(self, task: Task, now: datetime) -> bool:
        """The stored clock moves at most once per activity step."""
        return now - task.last_activity_at >= timedelta(seconds=self.activity_step_s)

    def idle_cutoff(self, now: datetime) -> datetime:
        """Open tasks whose last activity is at or before this are due to close."""
        return now - timedelta(seconds=self.task_idle_s)

    def is_idle(self, task: Task, now: datetime) -> bool:
        return task.is_open and task.last_activity_at <= self.idle_cutoff(now)

    def active_ago_s(self, task: Task, now: datetime) -> int:
        return max(0, int((now - task.last_activity_at).total_seconds()))
