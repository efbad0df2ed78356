"""Execs in SQL (``tx.execs``): one row per command started in a guest, ended once
(`Exec.ended`) by compare-and-set from ``running``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, case, func, select, update

from rift.domain.model import Exec
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.changes import check_limit
from rift.store.sql_base import SqlRepository
from rift.store.tables import EXEC_COLUMNS, execs, tasks, vms


def _exec_of(row: Row[Any]) -> Exec:
    return Exec(*tuple(row))  # selected with EXEC_COLUMNS: the fields' order


class SqlExecs(SqlRepository):
    name = "execs"

    def add(self, ex: Exec) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            if self.get(ex.id) is not None:
                return DuplicateKey("execs", "id")
            if not self._exists(tasks, tasks.c.id == ex.task_id):
                return MissingReference("execs", "task_id")
            if not self._exists(vms, vms.c.id == ex.vm_id):
                return MissingReference("execs", "vm_id")
            return None

        self._insert(execs, dataclasses.asdict(ex), diagnose)

    def get(self, exec_id: str) -> Exec | None:
        row = self._conn.execute(select(*EXEC_COLUMNS).where(execs.c.id == exec_id)).first()
        return None if row is None else _exec_of(row)

    def of_task(self, task_id: str, vm_id: str | None = None, *,
                running_only: bool = False) -> list[Exec]:
        query = select(*EXEC_COLUMNS).where(execs.c.task_id == task_id)
        if vm_id is not None:
            query = query.where(execs.c.vm_id == vm_id)
        if running_only:
            query = query.where(execs.c.status == "running")
        query = query.order_by(execs.c.started_at, execs.c.id)
        return [_exec_of(row) for row in self._conn.execute(query)]

    def running(self, limit: int, after: str | None = None) -> list[Exec]:
        check_limit(limit)
        query = select(*EXEC_COLUMNS).where(execs.c.status == "running")
        if after is not None:
            query = query.where(execs.c.id > after)
        query = query.order_by(execs.c.id).limit(limit)
        return [_exec_of(row) for row in self._conn.execute(query)]

    def count_running(self, task_ids: Sequence[str]) -> dict[str, int]:
        counts = dict.fromkeys(task_ids, 0)
        if not counts:
            return counts
        query = (select(execs.c.task_id, func.count()).where(
            execs.c.task_id.in_(list(counts)), execs.c.status == "running")
            .group_by(execs.c.task_id))
        for task_id, count in self._conn.execute(query):
            counts[task_id] = int(count)
        return counts

    def seen(self, exec_id: str, stdout_bytes: int, stderr_bytes: int) -> bool:
        self._writing("seen")
        statement = (update(execs).where(execs.c.id == exec_id, execs.c.status == "running")
                     .values(stdout_bytes=case((execs.c.stdout_bytes < stdout_bytes,
                                                stdout_bytes), else_=execs.c.stdout_bytes),
                             stderr_bytes=case((execs.c.stderr_bytes < stderr_bytes,
                                                stderr_bytes), else_=execs.c.stderr_bytes)))
        return self._conn.execute(statement).rowcount == 1

    def save(self, ex: Exec, was: Exec) -> bool:
        """What the transition from ``was`` changed (its end), while the row is still
        at ``was``'s status: one caller ends an exec."""
        return self._save(execs, ex, was, ("status",))
