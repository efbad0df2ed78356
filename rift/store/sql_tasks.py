"""Tasks in SQL: inserts, lists, the compare-and-set and the sweeps' scans."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Row, Select, Update, bindparam, delete, func, select, update

from rift.domain.model import Task
from rift.domain.store_errors import DuplicateKey, StoreError
from rift.store.changes import (
    TASK_CHANGEABLE,
    check_changes,
    check_limit,
    check_list_status,
)
from rift.store.sql_base import SqlTxBase
from rift.store.tables import TASK_COLUMNS, events, tasks, vms


def task_of(row: Row[Any]) -> Task:
    return Task(**row._asdict())


def select_tasks() -> Select[Any]:
    return select(*TASK_COLUMNS)


# Hot paths are built once with bind parameters: SQLAlchemy then skips building
# the statement and its cache key on every call (most of an attach's cost).
GET_TASK = select_tasks().where(tasks.c.id == bindparam("task_id"))
GET_TASK_FOR_UPDATE = GET_TASK.with_for_update()


@cache
def update_task_statement(keys: tuple[str, ...]) -> Update:
    """The compare-and-set for one set of changed columns."""
    return (
        update(tasks)
        .where(tasks.c.id == bindparam("_id"), tasks.c.lease_gen == bindparam("_gen"))
        .values(lease_gen=tasks.c.lease_gen + 1,
                **{key: bindparam(f"_v_{key}", type_=tasks.c[key].type) for key in keys})
    )


class TaskQueries(SqlTxBase):
    def insert_task(self, task: Task) -> None:
        self._writing("insert_task")

        def diagnose() -> StoreError | None:
            key = task.idempotency_key
            if key is not None and self.find_task_by_key(task.owner, key) is not None:
                return DuplicateKey("tasks", "idempotency_key")
            if self.get_task(task.id) is not None:
                return DuplicateKey("tasks", "id")
            return None

        self._insert(tasks, dataclasses.asdict(task), diagnose)

    def get_task(self, task_id: str) -> Task | None:
        if self._hot is not None:
            found = self._hot.get_task.first(self._conn, {"task_id": task_id})
            return None if found is None else Task(**found)
        # In a write transaction on PostgreSQL the row is locked (FOR UPDATE): racing
        # writers of one task queue here, as SQLite's BEGIN IMMEDIATE makes them,
        # so a contended takeover never loses every compare-and-set.
        statement = GET_TASK_FOR_UPDATE if self._writable else GET_TASK
        row = self._conn.execute(statement, {"task_id": task_id}).first()
        return None if row is None else task_of(row)

    def find_task_by_key(self, owner: str, key: str) -> Task | None:
        query = select_tasks().where(tasks.c.owner == owner, tasks.c.idempotency_key == key)
        row = self._conn.execute(query).first()
        return None if row is None else task_of(row)

    def list_tasks(
        self, owner: str | None, status: str, limit: int, after: str | None
    ) -> list[Task]:
        """Newest first. ``after`` is the id of the last task of the previous
        page; an ``after`` that names no task answers an empty page."""
        check_list_status(status)
        check_limit(limit)
        query = select_tasks()
        if owner is not None:
            query = query.where(tasks.c.owner == owner)
        if status != "all":
            query = query.where(tasks.c.status == status)
        if after is not None:
            seq = self._conn.scalar(select(tasks.c.seq).where(tasks.c.id == after))
            if seq is None:
                return []
            query = query.where(tasks.c.seq < seq)
        query = query.order_by(tasks.c.seq.desc()).limit(limit)
        return [task_of(row) for row in self._conn.execute(query)]

    def count_open_tasks(self, owner: str) -> int:
        query = select(func.count()).select_from(tasks).where(
            tasks.c.owner == owner, tasks.c.status == "open"
        )
        return int(self._conn.scalar(query) or 0)

    def count_open_tasks_all(self) -> int:
        query = select(func.count()).select_from(tasks).where(tasks.c.status == "open")
        return int(self._conn.scalar(query) or 0)

    def count_tasks_created_since(self, owner: str, since: datetime) -> int:
        query = select(func.count()).select_from(tasks).where(
            tasks.c.owner == owner, tasks.c.created_at >= since
        )
        return int(self._conn.scalar(query) or 0)

    def oldest_task_created_since(self, owner: str, since: datetime) -> datetime | None:
        query = select(func.min(tasks.c.created_at)).where(
            tasks.c.owner == owner, tasks.c.created_at >= since
        )
        oldest: datetime | None = self._conn.scalar(query)
        return oldest

    def update_task(self, task_id: str, expected_gen: int, **changes: Any) -> bool:
        """One conditional UPDATE: the row changes (and ``lease_gen`` moves on)
        only while it is still at ``expected_gen``, so racers get one winner."""
        self._writing("update_task")
        check_changes("task", changes, TASK_CHANGEABLE)
        keys = tuple(sorted(changes))
        params = {"_id": task_id, "_gen": expected_gen,
                  **{f"_v_{key}": value for key, value in changes.items()}}
        if self._hot is not None:
            return int(self._hot.update_task(keys).execute(self._conn, params).rowcount) == 1
        return self._conn.execute(update_task_statement(keys), params).rowcount == 1

    def touch_task(self, task_id: str, now: datetime, not_after: datetime) -> bool:
        self._writing("touch_task")
        statement = (
            update(tasks)
            .where(
                tasks.c.id == task_id,
                tasks.c.status == "open",
                tasks.c.last_activity_at <= not_after,
            )
            .values(last_activity_at=now)
        )
        return self._conn.execute(statement).rowcount == 1

    def due_idle_tasks(self, cutoff: datetime, limit: int) -> list[Task]:
        """Open tasks quiet since ``cutoff`` or longer, the quietest first."""
        check_limit(limit)
        query = (
            select_tasks()
            .where(tasks.c.status == "open", tasks.c.last_activity_at <= cutoff)
            .order_by(tasks.c.last_activity_at, tasks.c.seq)
            .limit(limit)
        )
        return [task_of(row) for row in self._conn.execute(query)]

    def purge_closed_before(self, cutoff: datetime, limit: int) -> list[str]:
        """Delete up to ``limit`` tasks closed before ``cutoff``, with their
        events and VM rows (in that order), the longest closed first."""
        self._writing("purge_closed_before")
        check_limit(limit)
        query = (
            select(tasks.c.id)
            .where(tasks.c.status == "closed", tasks.c.closed_at < cutoff)
            .order_by(tasks.c.closed_at, tasks.c.seq)
            .limit(limit)
        )
        ids = list(self._conn.scalars(query))
        if ids:
            self._conn.execute(delete(events).where(events.c.task_id.in_(ids)))
            self._conn.execute(delete(vms).where(vms.c.task_id.in_(ids)))
            self._conn.execute(delete(tasks).where(tasks.c.id.in_(ids)))
        return ids
