"""Code contexts in SQL (``tx.code_contexts``): one row per context of a VM, by
(VM id, context id); a run's start and end update it, its end clearing the run in
flight only when it is that run (a later one queued behind it stays)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, select, update

from rift.domain.code_contexts import CodeContext, RunEnd
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import CODE_CONTEXT_COLUMNS, code_contexts, vms

_C = code_contexts.c


def _context_of(row: Row[Any]) -> CodeContext:
    return CodeContext(*tuple(row))  # selected with CODE_CONTEXT_COLUMNS: the fields' order


class SqlCodeContexts(SqlRepository):
    name = "code_contexts"

    def put(self, context: CodeContext) -> None:
        """Write the context as it is: its row replaced, or added."""
        self._writing("put")
        values = dataclasses.asdict(context)
        statement = (update(code_contexts).where(_C.vm_id == context.vm_id,
                                                 _C.id == context.id).values(**values))
        if self._conn.execute(statement).rowcount == 1:
            return

        def diagnose() -> StoreError | None:
            if not self._exists(vms, vms.c.id == context.vm_id):
                return MissingReference("code_contexts", "vm_id")
            return DuplicateKey("code_contexts", "id")

        self._insert(code_contexts, values, diagnose)

    def get(self, vm_id: str, context_id: str) -> CodeContext | None:
        row = self._conn.execute(select(*CODE_CONTEXT_COLUMNS).where(
            _C.vm_id == vm_id, _C.id == context_id)).first()
        return None if row is None else _context_of(row)

    def of_vms(self, vm_ids: Sequence[str]) -> dict[str, list[CodeContext]]:
        found: dict[str, list[CodeContext]] = {vm_id: [] for vm_id in vm_ids}
        if not found:
            return found
        query = (select(*CODE_CONTEXT_COLUMNS).where(_C.vm_id.in_(list(found)))
                 .order_by(_C.created_at, _C.id))
        for row in self._conn.execute(query):
            context = _context_of(row)
            found[context.vm_id].append(context)
        return found

    def run_started(self, vm_id: str, context_id: str, run_id: str,
                    until: datetime) -> bool:
        self._writing("run_started")
        statement = (update(code_contexts).where(_C.vm_id == vm_id, _C.id == context_id)
                     .values(run_id=run_id, run_until=until))
        return self._conn.execute(statement).rowcount == 1

    def run_ended(self, vm_id: str, context_id: str, end: RunEnd) -> bool:
        self._writing("run_ended")
        where = (_C.vm_id == vm_id, _C.id == context_id)
        done = self._conn.execute(update(code_contexts).where(*where).values(
            last_run_at=end.at, execution_count=end.execution_count,
            last_status=end.status)).rowcount
        mine = () if end.run_id is None else (_C.run_id == end.run_id,)  # None: whichever runs
        self._conn.execute(update(code_contexts).where(*where, *mine)
                           .values(run_id=None, run_until=None))
        return done == 1

    def remove(self, vm_id: str, context_id: str | None = None) -> int:
        self._writing("remove")
        where = [_C.vm_id == vm_id]
        if context_id is not None:
            where.append(_C.id == context_id)
        return int(self._conn.execute(delete(code_contexts).where(*where)).rowcount)

    def expire_runs(self, now: datetime) -> int:
        self._writing("expire_runs")
        statement = (update(code_contexts).where(_C.run_until.is_not(None), _C.run_until <= now)
                     .values(run_id=None, run_until=None))
        return int(self._conn.execute(statement).rowcount)
