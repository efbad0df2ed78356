"""Tasks in memory: the same answers as ``rift.store.sql_tasks``."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from rift.domain.model import Task
from rift.domain.store_errors import DuplicateKey
from rift.store.changes import (
    TASK_CHANGEABLE,
    check_changes,
    check_limit,
    check_list_status,
    utc,
)
from rift.store.memory_base import MemoryTxBase, utc_changes, utc_values


class MemoryTaskQueries(MemoryTxBase):
    def insert_task(self, task: Task) -> None:
        self._writing("insert_task")
        key = task.idempotency_key
        if key is not None and self.find_task_by_key(task.owner, key) is not None:
            raise DuplicateKey("tasks", "idempotency_key")
        if task.id in self._s.tasks:
            raise DuplicateKey("tasks", "id")
        self._s.tasks[task.id] = utc_values(task)
        self._s.task_seq[task.id] = self._next_seq()

    def get_task(self, task_id: str) -> Task | None:
        return self._s.tasks.get(task_id)

    def find_task_by_key(self, owner: str, key: str) -> Task | None:
        return next(
            (t for t in self._s.tasks.values() if t.owner == owner and t.idempotency_key == key),
            None,
        )

    def list_tasks(
        self, owner: str | None, status: str, limit: int, after: str | None
    ) -> list[Task]:
        check_list_status(status)
        check_limit(limit)
        below: int | None = None
        if after is not None:
            below = self._s.task_seq.get(after)
            if below is None:
                return []
        found: list[Task] = []
        for task in sorted(self._s.tasks.values(), key=self._task_seq, reverse=True):
            if len(found) >= limit:
                break
            if below is not None and self._task_seq(task) >= below:
                continue
            if owner is not None and task.owner != owner:
                continue
            if status not in ("all", task.status):
                continue
            found.append(task)
        return found

    def _task_seq(self, task: Task) -> int:
        return self._s.task_seq[task.id]

    def count_open_tasks(self, owner: str) -> int:
        return sum(1 for t in self._s.tasks.values() if t.owner == owner and t.is_open)

    def count_open_tasks_all(self) -> int:
        return sum(1 for t in self._s.tasks.values() if t.is_open)

    def _tasks_created_since(self, owner: str, since: datetime) -> list[datetime]:
        since = utc(since)
        return [
            t.created_at for t in self._s.tasks.values()
            if t.owner == owner and t.created_at >= since
        ]

    def count_tasks_created_since(self, owner: str, since: datetime) -> int:
        return len(self._tasks_created_since(owner, since))

    def oldest_task_created_since(self, owner: str, since: datetime) -> datetime | None:
        return min(self._tasks_created_since(owner, since), default=None)

    def update_task(self, task_id: str, expected_gen: int, **changes: Any) -> bool:
        self._writing("update_task")
        check_changes("task", changes, TASK_CHANGEABLE)
        task = self._s.tasks.get(task_id)
        if task is None or task.lease_gen != expected_gen:
            return False
        self._s.tasks[task_id] = dataclasses.replace(
            task, lease_gen=task.lease_gen + 1, **utc_changes(changes)
        )
        return True

    def touch_task(self, task_id: str, now: datetime, not_after: datetime) -> bool:
        self._writing("touch_task")
        task = self._s.tasks.get(task_id)
        if task is None or not task.is_open or task.last_activity_at > utc(not_after):
            return False
        self._s.tasks[task_id] = dataclasses.replace(task, last_activity_at=utc(now))
        return True

    def due_idle_tasks(self, cutoff: datetime, limit: int) -> list[Task]:
        check_limit(limit)
        cutoff = utc(cutoff)
        due = [t for t in self._s.tasks.values() if t.is_open and t.last_activity_at <= cutoff]
        due.sort(key=lambda t: (t.last_activity_at, self._task_seq(t)))
        return due[:limit]

    def purge_closed_before(self, cutoff: datetime, limit: int) -> list[str]:
        self._writing("purge_closed_before")
        check_limit(limit)
        cutoff = utc(cutoff)
        closed = [
            t for t in self._s.tasks.values()
            if t.status == "closed" and t.closed_at is not None and t.closed_at < cutoff
        ]
        closed.sort(key=lambda t: (t.closed_at or cutoff, self._task_seq(t)))
        ids = [t.id for t in closed[:limit]]
        gone = set(ids)
        for event_id in [i for i, e in self._s.events.items() if e.task_id in gone]:
            del self._s.events[event_id]
        for vm_id in [v.id for v in self._s.vms.values() if v.task_id in gone]:
            del self._s.vms[vm_id]
            del self._s.vm_seq[vm_id]
        for task_id in ids:
            del self._s.tasks[task_id]
            del self._s.task_seq[task_id]
        return ids
