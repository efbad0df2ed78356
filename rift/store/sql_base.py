"""What every part of the SQL transaction shares: the connection, the
read-only guard and inserts that say which key they hit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Table, exists, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from rift.domain.store_errors import ReadOnlyTransaction, StoreError

if TYPE_CHECKING:
    from rift.store.hot import HotStatements


class SqlTxBase:
    """One transaction on one connection; ``writable`` is False inside ``read()``."""

    def __init__(self, conn: Connection, *, writable: bool,
                 hot: HotStatements | None = None) -> None:
        self._conn = conn
        self._writable = writable
        self._hot = hot

    @property
    def connection(self) -> Connection:
        return self._conn

    def _writing(self, method: str) -> None:
        if not self._writable:
            raise ReadOnlyTransaction(method)

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
