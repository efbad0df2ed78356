"""The lease hot path, prepared once per SQLite store (see `prepared.py`)."""

from __future__ import annotations

from functools import cache

from sqlalchemy.engine import Dialect

from rift.store.prepared import Prepared
from rift.store.sql_tasks import GET_TASK, update_task_statement
from rift.store.sql_tx import _INSERT_EVENT, EVENT_COLUMNS


class HotStatements:
    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self.get_task = Prepared(GET_TASK, dialect)
        self.insert_event = Prepared(_INSERT_EVENT, dialect, EVENT_COLUMNS)
        self.update_task = cache(self._update_task)

    def _update_task(self, keys: tuple[str, ...]) -> Prepared:
        return Prepared(update_task_statement(keys), self._dialect)
