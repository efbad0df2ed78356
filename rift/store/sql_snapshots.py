"""Snapshots in SQL (``tx.snapshots``): one row per snapshot, its state changed
by compare-and-set, deleted once its files are gone."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, delete, func, select

from rift.domain.records import Snapshot
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import SNAPSHOT_COLUMNS, snapshots, tasks


def _snapshot_of(row: Row[Any]) -> Snapshot:
    return Snapshot(*tuple(row))  # selected with SNAPSHOT_COLUMNS: the fields' order


class SqlSnapshots(SqlRepository):
    name = "snapshots"

    def add(self, snap: Snapshot) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            if self.get(snap.id) is not None:
                return DuplicateKey("snapshots", "id")
            if not self._exists(tasks, tasks.c.id == snap.task_id):
                return MissingReference("snapshots", "task_id")
            return None

        self._insert(snapshots, dataclasses.asdict(snap), diagnose)

    def get(self, snapshot_id: str) -> Snapshot | None:
        row = self._conn.execute(select(*SNAPSHOT_COLUMNS)
                                 .where(snapshots.c.id == snapshot_id)).first()
        return None if row is None else _snapshot_of(row)

    def of_task(self, task_id: str) -> list[Snapshot]:
        query = (select(*SNAPSHOT_COLUMNS).where(snapshots.c.task_id == task_id)
                 .order_by(snapshots.c.created_at, snapshots.c.id))
        return [_snapshot_of(row) for row in self._conn.execute(query)]

    def of_tasks(self, task_ids: Sequence[str]) -> dict[str, list[Snapshot]]:
        found: dict[str, list[Snapshot]] = {task_id: [] for task_id in task_ids}
        if not found:
            return found
        query = (select(*SNAPSHOT_COLUMNS).where(snapshots.c.task_id.in_(list(found)))
                 .order_by(snapshots.c.created_at, snapshots.c.id))
        for row in self._conn.execute(query):
            snap = _snapshot_of(row)
            found[snap.task_id].append(snap)
        return found

    def all(self) -> list[Snapshot]:
        query = select(*SNAPSHOT_COLUMNS).order_by(snapshots.c.created_at, snapshots.c.id)
        return [_snapshot_of(row) for row in self._conn.execute(query)]

    def save(self, snap: Snapshot, was: Snapshot) -> bool:
        """What the transition from ``was`` changed, while the row is still in
        ``was``'s state."""
        return self._save(snapshots, snap, was, ("state",))

    def remove(self, snap: Snapshot) -> bool:
        self._writing("remove")
        statement = delete(snapshots).where(snapshots.c.id == snap.id,
                                            snapshots.c.state == snap.state)
        return self._conn.execute(statement).rowcount == 1

    def bytes_of_owner(self, owner: str) -> int:
        query = (select(func.coalesce(func.sum(snapshots.c.bytes), 0))
                 .where(snapshots.c.owner == owner))
        return int(self._conn.execute(query).scalar_one())

    def bytes_by_host(self) -> dict[str, tuple[int, int]]:
        query = (select(snapshots.c.host, func.count(),
                        func.coalesce(func.sum(snapshots.c.bytes), 0))
                 .group_by(snapshots.c.host))
        return {host: (int(count), int(total)) for host, count, total in
                self._conn.execute(query)}
