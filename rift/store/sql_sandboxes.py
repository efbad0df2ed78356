"""E2B sandboxes in SQL (``tx.sandboxes``): one row per sandbox, by its VM's id
(rift.domain.sandboxes)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, select, update

from rift.domain.sandboxes import Sandbox
from rift.domain.store_errors import DuplicateKey, StoreError
from rift.store.changes import check_limit
from rift.store.sql_base import SqlRepository
from rift.store.tables import E2B_SANDBOX_COLUMNS, e2b_sandboxes


def _sandbox_of(row: Row[Any]) -> Sandbox:
    found = Sandbox(*tuple(row))  # selected with E2B_SANDBOX_COLUMNS: the fields' order
    return dataclasses.replace(found, metadata=dict(found.metadata or {}),
                               envs=dict(found.envs or {}))


class SqlSandboxes(SqlRepository):
    name = "sandboxes"

    def add(self, sandbox: Sandbox) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            return DuplicateKey("e2b_sandboxes", "vm_id")

        self._insert(e2b_sandboxes, dataclasses.asdict(sandbox), diagnose)

    def get(self, vm_id: str) -> Sandbox | None:
        row = self._conn.execute(select(*E2B_SANDBOX_COLUMNS)
                                 .where(e2b_sandboxes.c.vm_id == vm_id)).first()
        return None if row is None else _sandbox_of(row)

    def of_owner(self, owner: str) -> list[Sandbox]:
        query = (select(*E2B_SANDBOX_COLUMNS).where(e2b_sandboxes.c.owner == owner)
                 .order_by(e2b_sandboxes.c.started_at, e2b_sandboxes.c.vm_id))
        return [_sandbox_of(row) for row in self._conn.execute(query)]

    def set_end(self, vm_id: str, end_at: datetime | None) -> bool:
        self._writing("set_end")
        done = self._conn.execute(update(e2b_sandboxes).where(e2b_sandboxes.c.vm_id == vm_id)
                                  .values(end_at=end_at))
        return bool(done.rowcount)

    def set_traffic(self, vm_id: str, traffic_digest: str | None) -> bool:
        self._writing("set_traffic")
        done = self._conn.execute(update(e2b_sandboxes).where(e2b_sandboxes.c.vm_id == vm_id)
                                  .values(traffic_digest=traffic_digest))
        return bool(done.rowcount)

    def due(self, now: datetime, limit: int) -> list[Sandbox]:
        check_limit(limit)
        query = (select(*E2B_SANDBOX_COLUMNS)
                 .where(e2b_sandboxes.c.end_at.is_not(None), e2b_sandboxes.c.end_at <= now)
                 .order_by(e2b_sandboxes.c.end_at, e2b_sandboxes.c.vm_id).limit(limit))
        return [_sandbox_of(row) for row in self._conn.execute(query)]

    def remove(self, vm_id: str) -> bool:
        self._writing("remove")
        done = self._conn.execute(delete(e2b_sandboxes).where(e2b_sandboxes.c.vm_id == vm_id))
        return bool(done.rowcount)
