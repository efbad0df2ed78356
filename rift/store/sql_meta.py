"""Installation facts in SQL: a small key-value table with compare-and-set."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from rift.store.sql_base import SqlTxBase
from rift.store.tables import meta, tasks


class MetaQueries(SqlTxBase):
    def get_meta(self, key: str) -> str | None:
        value = self._conn.scalar(select(meta.c.value).where(meta.c.key == key))
        return None if value is None else str(value)

    def swap_meta(self, key: str, expected: str | None, value: str) -> bool:
        """Set ``key`` to ``value`` where it is still ``expected`` (None: absent)."""
        self._writing("swap_meta")
        if expected is None:
            if self.get_meta(key) is not None:
                return False
            try:  # a savepoint: another replica inserting it first leaves this tx usable
                with self._conn.begin_nested():
                    self._conn.execute(insert(meta).values(key=key, value=value))
            except IntegrityError:
                return False
            return True
        statement = update(meta).where(meta.c.key == key, meta.c.value == expected)
        return self._conn.execute(statement.values(value=value)).rowcount == 1

    def shift_open_tasks(self, seconds: float) -> int:
        """Move every open task's last activity later by ``seconds`` (time the
        control plane was down is not quiet time); answers how many moved."""
        self._writing("shift_open_tasks")
        rows = self._conn.execute(
            select(tasks.c.id, tasks.c.last_activity_at).where(tasks.c.status == "open")).all()
        if rows:
            delta = timedelta(seconds=seconds)
            statement = (update(tasks).where(tasks.c.id == bindparam("_id"))
                         .values(last_activity_at=bindparam("_at")))
            self._conn.execute(statement, [{"_id": row.id, "_at": row.last_activity_at + delta}
                                           for row in rows])
        return len(rows)
