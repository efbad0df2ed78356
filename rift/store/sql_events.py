"""Each task's event log in SQL (``tx.events``): append, and page after an id."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select

from rift.domain.model import Event, NewEvent
from rift.store.changes import check_limit
from rift.store.sql_base import SqlRepository
from rift.store.tables import EVENT_COLUMNS, events

# Built once: the append is on the lease hot path (every attach makes an event).
ADD_EVENT = events.insert()


def event_of(row: Row[Any]) -> Event:
    return Event(*tuple(row))  # selected with EVENT_COLUMNS: the fields' order


class SqlEvents(SqlRepository):
    name = "events"

    def add(self, event: NewEvent) -> int:
        self._writing("add")
        row = {"task_id": event.task_id, "type": event.type, "at": event.at,
               "actor": event.actor, "details": event.details}
        key = self._conn.execute(ADD_EVENT, row).inserted_primary_key
        if key is None:  # pragma: no cover - every insert here has a key
            raise RuntimeError("the database gave the event no id")
        return int(key[0])

    def page(self, task_id: str, after_id: int, limit: int) -> list[Event]:
        """The task's events with ids above ``after_id``, oldest first."""
        check_limit(limit)
        query = (
            select(*EVENT_COLUMNS)
            .where(events.c.task_id == task_id, events.c.id > after_id)
            .order_by(events.c.id)
            .limit(limit)
        )
        return [event_of(row) for row in self._conn.execute(query)]

    def of_type(self, task_ids: Sequence[str], event_type: str,
                since: datetime | None = None) -> list[Event]:
        """The asked tasks' events of one type (at or after `since`), oldest first."""
        if not task_ids:
            return []
        query = (select(*EVENT_COLUMNS)
                 .where(events.c.task_id.in_(list(task_ids)), events.c.type == event_type)
                 .order_by(events.c.id))
        if since is not None:
            query = query.where(events.c.at >= since)
        return [event_of(row) for row in self._conn.execute(query)]
