"""Tasks in SQL (``tx.tasks``): inserts, pages, the compare-and-set that saves a
lease or close transition, the touch, and the sweeps' scans."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Row, Select, Update, bindparam, delete, func, select, update
from sqlalchemy.engine import Connection

from rift.domain.model import Task
from rift.domain.store_errors import DuplicateKey, StoreError
from rift.store.changes import check_limit, check_list_status
from rift.store.sql_base import SqlRepository
from rift.store.tables import (
    TASK_COLUMNS,
    code_contexts,
    events,
    execs,
    exposures,
    snapshots,
    tasks,
    vms,
)

# What a transition may change: the lease state. `save` writes the part of it the
# transition changed (against the task as this transaction read it), so a column
# another writer moved meanwhile (a touch's last activity) is never put back.
LEASE_STATE = ("status", "secret_digest", "holder", "held_since", "last_activity_at",
               "closed_at", "close_reason")


def task_of(row: Row[Any]) -> Task:
    return Task(*tuple(row))  # selected with TASK_COLUMNS: the fields' order


def select_tasks() -> Select[Any]:
    return select(*TASK_COLUMNS)


# The statements every lease call runs are built once, with bind parameters, so
# each call skips building the statement and its cache key (most of a simple
# statement's cost in Core).
GET_TASK = select_tasks().where(tasks.c.id == bindparam("task_id"))
# In a write transaction on PostgreSQL the row is locked (FOR UPDATE): racing
# writers of one task queue here, as SQLite's BEGIN IMMEDIATE makes them, so a
# contended takeover never loses every compare-and-set.
GET_TASK_FOR_UPDATE = GET_TASK.with_for_update()


@cache
def save_statement(keys: tuple[str, ...]) -> Update:
    """The compare-and-set for one set of changed columns: a handful in all, one per
    kind of transition, each built once."""
    return (
        update(tasks)
        .where(tasks.c.id == bindparam("_id"), tasks.c.lease_gen == bindparam("_gen"))
        .values(lease_gen=bindparam("_next"),
                **{key: bindparam(f"_v_{key}", type_=tasks.c[key].type) for key in keys})
    )


# A call under a good handle moves the activity clock at most once per step.
TOUCH_TASK = (
    update(tasks)
    .where(tasks.c.id == bindparam("task_id"), tasks.c.status == "open",
           tasks.c.last_activity_at <= bindparam("not_after", type_=tasks.c.last_activity_at.type))
    .values(last_activity_at=bindparam("now", type_=tasks.c.last_activity_at.type))
)


class SqlTasks(SqlRepository):
    name = "tasks"

    def __init__(self, conn: Connection, *, writable: bool) -> None:
        super().__init__(conn, writable=writable)
        self._read: dict[str, Task] = {}  # each task as this transaction last saw it

    def _task(self, row: Row[Any]) -> Task:
        task = task_of(row)
        self._read[task.id] = task
        return task

    def add(self, task: Task) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            key = task.idempotency_key
            if key is not None and self.find_by_key(task.owner, key) is not None:
                return DuplicateKey("tasks", "idempotency_key")
            if self._exists(tasks, tasks.c.id == task.id):
                return DuplicateKey("tasks", "id")
            return None

        self._insert(tasks, dataclasses.asdict(task), diagnose)

    def get(self, task_id: str) -> Task | None:
        statement = GET_TASK_FOR_UPDATE if self._writable else GET_TASK
        row = self._conn.execute(statement, {"task_id": task_id}).first()
        return None if row is None else self._task(row)

    def find_by_key(self, owner: str, key: str) -> Task | None:
        query = select_tasks().where(tasks.c.owner == owner, tasks.c.idempotency_key == key)
        row = self._conn.execute(query).first()
        return None if row is None else self._task(row)

    def page(self, owner: str | None, status: str, limit: int, after: str | None) -> list[Task]:
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
        return [self._task(row) for row in self._conn.execute(query)]

    def recently_closed(self, owner: str, limit: int) -> list[Task]:
        check_limit(limit)
        query = (
            select_tasks()
            .where(tasks.c.owner == owner, tasks.c.status == "closed")
            .order_by(tasks.c.closed_at.desc(), tasks.c.seq.desc())
            .limit(limit)
        )
        return [self._task(row) for row in self._conn.execute(query)]

    def count_open(self, owner: str | None) -> int:
        query = select(func.count()).select_from(tasks).where(tasks.c.status == "open")
        if owner is not None:
            query = query.where(tasks.c.owner == owner)
        return int(self._conn.scalar(query) or 0)

    def save(self, task: Task, expected_gen: int) -> bool:
        """One conditional UPDATE: the row takes ``task``'s lease state and
        generation only while it is still at ``expected_gen``, so racers get one
        winner. Of the lease state, what changed since this transaction read the
        task at ``expected_gen`` is written (all of it for a task it did not read);
        ids, owner, name and creation facts never are."""
        self._writing("save")
        if task.lease_gen != expected_gen + 1:
            raise ValueError(f"a saved task moves its lease generation on by one: "
                             f"expected {expected_gen + 1}, got {task.lease_gen}")
        before = self._read.get(task.id)
        keys = tuple(key for key in LEASE_STATE
                     if before is None or before.lease_gen != expected_gen
                     or getattr(task, key) != getattr(before, key))
        params = {"_id": task.id, "_gen": expected_gen, "_next": task.lease_gen,
                  **{f"_v_{key}": getattr(task, key) for key in keys}}
        won = self._conn.execute(save_statement(keys), params).rowcount == 1
        if won:
            self._read[task.id] = task
        return won

    def touch(self, task_id: str, now: datetime, not_after: datetime) -> bool:
        self._writing("touch")
        params = {"task_id": task_id, "now": now, "not_after": not_after}
        won = self._conn.execute(TOUCH_TASK, params).rowcount == 1
        if won and task_id in self._read:
            self._read[task_id] = dataclasses.replace(self._read[task_id], last_activity_at=now)
        return won

    def due_idle(self, cutoff: datetime, limit: int) -> list[Task]:
        check_limit(limit)
        query = (
            select_tasks()
            .where(tasks.c.status == "open", tasks.c.last_activity_at <= cutoff)
            .order_by(tasks.c.last_activity_at, tasks.c.seq)
            .limit(limit)
        )
        return [self._task(row) for row in self._conn.execute(query)]

    def purge_closed_before(self, cutoff: datetime, limit: int) -> list[str]:
        """Delete up to ``limit`` tasks closed before ``cutoff``, with their
        events, exec and VM rows (in that order), the longest closed first."""
        self._writing("purge_closed_before")
        check_limit(limit)
        query = (
            select(tasks.c.id)
            .where(tasks.c.status == "closed", tasks.c.closed_at < cutoff)
            .order_by(tasks.c.closed_at, tasks.c.seq)
            .limit(limit)
        )
        ids = list(self._conn.scalars(query))
        self._read.clear()
        if ids:
            self._conn.execute(delete(events).where(events.c.task_id.in_(ids)))
            self._conn.execute(delete(execs).where(execs.c.task_id.in_(ids)))
            self._conn.execute(delete(snapshots).where(snapshots.c.task_id.in_(ids)))
            self._conn.execute(delete(exposures).where(exposures.c.task_id.in_(ids)))
            self._conn.execute(delete(code_contexts).where(code_contexts.c.task_id.in_(ids)))
            self._conn.execute(delete(vms).where(vms.c.task_id.in_(ids)))
            self._conn.execute(delete(tasks).where(tasks.c.id.in_(ids)))
        return ids

    def shift_open(self, seconds: float) -> int:
        """Move every open task's last activity later by ``seconds`` (time the
        control plane was down is not quiet time); answers how many moved."""
        self._writing("shift_open")
        self._read.clear()
        rows = self._conn.execute(
            select(tasks.c.id, tasks.c.last_activity_at).where(tasks.c.status == "open")).all()
        if rows:
            delta = timedelta(seconds=seconds)
            statement = (update(tasks).where(tasks.c.id == bindparam("_id"))
                         .values(last_activity_at=bindparam("_at")))
            self._conn.execute(statement, [{"_id": row.id, "_at": row.last_activity_at + delta}
                                           for row in rows])
        return len(rows)
