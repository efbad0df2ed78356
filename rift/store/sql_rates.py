"""The client budgets' counts in SQL (``tx.rates``, SPEC §15): how many rows of one
kind one key made within a window, and the oldest's time, in one indexed read."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Column, ColumnElement, func, select

from rift.domain.records import RateKind, RateWindow
from rift.store.sql_base import SqlRepository
from rift.store.tables import events, execs, tasks, vms

# kind -> (the key's column, the time column, what else a row must be)
_COUNTED: Mapping[RateKind, tuple[Column[Any], Column[Any], tuple[ColumnElement[bool], ...]]] = {
    "tasks": (tasks.c.owner, tasks.c.created_at, ()),
    "vms": (vms.c.owner, vms.c.created_at, ()),
    "execs": (execs.c.owner, execs.c.started_at, ()),
    "stale_rejected": (events.c.task_id, events.c.at, (events.c.type == "stale_rejected",)),
}


class SqlRates(SqlRepository):
    name = "rates"

    def window(self, kind: RateKind, key: str, since: datetime) -> RateWindow:
        by, at, more = _COUNTED[kind]
        query = select(func.count(), func.min(at)).where(by == key, at >= since, *more)
        count, oldest = self._conn.execute(query).one()
        return RateWindow(int(count or 0), oldest)
