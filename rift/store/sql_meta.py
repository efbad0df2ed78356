"""Installation facts in SQL (``tx.meta``): a small key-value table with compare-and-set."""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from rift.store.sql_base import SqlRepository
from rift.store.tables import meta


class SqlMeta(SqlRepository):
    name = "meta"

    def get(self, key: str) -> str | None:
        value = self._conn.scalar(select(meta.c.value).where(meta.c.key == key))
        return None if value is None else str(value)

    def swap(self, key: str, expected: str | None, value: str) -> bool:
        """Set ``key`` to ``value`` where it is still ``expected`` (None: absent)."""
        self._writing("swap")
        if expected is None:
            if self.get(key) is not None:
                return False
            try:  # a savepoint: another replica inserting it first leaves this tx usable
                with self._conn.begin_nested():
                    self._conn.execute(insert(meta).values(key=key, value=value))
            except IntegrityError:
                return False
            return True
        statement = update(meta).where(meta.c.key == key, meta.c.value == expected)
        return self._conn.execute(statement.values(value=value)).rowcount == 1
