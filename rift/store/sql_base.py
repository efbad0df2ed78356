"""What every SQL repository shares: the transaction's connection, the read-only
guard and inserts that say which key they hit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Table, exists, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from rift.domain.store_errors import ReadOnlyTransaction, StoreError


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
