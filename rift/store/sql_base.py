"""What every SQL repository shares: the transaction's connection, the read-only
guard, inserts that say which key they hit and the compare-and-set that saves a
domain transition (`_save`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import Column, ColumnElement, Table, exists, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from rift.domain.store_errors import ReadOnlyTransaction, StoreError
from rift.store.changes import changed


class SqlRepository:
    """Rows of one aggregate, in the transaction of one connection; ``writable``
    is False inside ``store.read()``."""

    name: ClassVar[str]  # the repository's attribute on the unit of work: ``tx.<name>``

    def __init__(self, conn: Connection, *, writable: bool) -> None:
        self._conn = conn
        self._writable = writable

    def _writing(self, method: str) -> None:
        if not self._writable:
            raise ReadOnlyTransaction(f"tx.{self.name}.{method}")

    def _exists(self, table: Table, *where: ColumnElement[bool]) -> bool:
        return bool(self._conn.scalar(select(exists().where(*where).select_from(table))))

    def _save(self, table: Table, new: Any, was: Any, guard: Sequence[str] | None,
              key: str = "id") -> bool:
        """One conditional UPDATE: the columns ``new`` changed from ``was`` (a
        transition of it), where the row still holds ``was``'s values of the
        ``guard`` columns (its state; None: each column the transition changes).
        True when this call won; with nothing changed, True while the row is so."""
        self._writing("save")
        changes = changed(new, was, key)
        names = list(changes) if guard is None else guard
        where = [table.c[key] == getattr(was, key),
                 *(_holds(table.c[name], getattr(was, name)) for name in names)]
        if not changes:
            return self._exists(table, *where)
        statement = update(table).where(*where).values(**changes)
        return self._conn.execute(statement).rowcount == 1

    def _insert(
        self,
        table: Table,
        values: Mapping[str, Any],
        diagnose: Callable[[], StoreError | None],
    ) -> None:
        """Insert one row inside a savepoint, so a key clash leaves the
        transaction usable; ``diagnose`` names the clash (``DuplicateKey``,
        ``MissingReference``) or answers None to let the database error through."""
        try:
            with self._conn.begin_nested():
                self._conn.execute(table.insert().values(**values))
        except IntegrityError as exc:
            known = diagnose()
            if known is None:
                raise
            raise known from exc


def _holds(column: Column[Any], value: Any) -> ColumnElement[bool]:
    return column.is_(None) if value is None else column == value
