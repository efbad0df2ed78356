"""The SQL store: SQLite (WAL) for one process, PostgreSQL for replicas.

``with store.write() as tx:`` is one transaction on one connection: it commits
when the block ends and rolls back when it raises. On SQLite a write takes the
database's write lock at its start (``BEGIN IMMEDIATE``), so writers queue on
``busy_timeout`` instead of failing with "database is locked" when a read
would have to become a write half-way; reads use a plain ``BEGIN`` and see one
snapshot. On PostgreSQL writes run at READ COMMITTED, where every lease change
is a single conditional UPDATE (compare-and-set), and reads at REPEATABLE READ,
read-only, so a read sees one snapshot too.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, ExceptionContext, make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from rift.domain.errors import StoreUnavailable
from rift.store.sql_tx import SqlTx

log = logging.getLogger("rift.store")

BUSY_TIMEOUT_S = 30
POOL_SIZE = 32
MAX_OVERFLOW = 8


def default_sqlite_url(data_dir: Path) -> str:
    """``sqlite:///<data_dir>/rift.db``, creating the directory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(data_dir / 'rift.db').resolve()}"


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take BEGIN away from the sqlite3 driver; SqlStore.read and write say it.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _sqlite_engine(url: URL, pool_size: int) -> Engine:
    if url.database in (None, "", ":memory:"):
        raise ValueError("SqlStore needs a SQLite file (sqlite:///path), not an in-memory one")
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=MAX_OVERFLOW,
        pool_timeout=BUSY_TIMEOUT_S,
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        # read() and write() always end their transaction (commit or rollback),
        # so the pool need not roll back again on every check-in.
        pool_reset_on_return=None,
    )
    event.listen(engine, "connect", _sqlite_on_connect)
    return engine


def make_engine(url: str, *, pool_size: int = POOL_SIZE) -> Engine:
    """The engine ``SqlStore`` uses, configured for SQLite or PostgreSQL."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, pool_size)
    engine = create_engine(
        parsed,
        pool_size=pool_size,
        max_overflow=MAX_OVERFLOW,
        pool_timeout=BUSY_TIMEOUT_S,
        pool_pre_ping=True,
        isolation_level="READ COMMITTED",
        # A database behind a network that drops packets answers in seconds, not
        # after the operating system's TCP timeout.
        connect_args={"connect_timeout": 10},
    )
    event.listen(engine, "handle_error", _a_failed_ping_loses_the_connection)
    return engine


def _a_failed_ping_loses_the_connection(context: ExceptionContext) -> None:
    """A pooled connection that cannot answer its ping is replaced, whatever the
    driver raised: a server ending the connection during the ping can leave psycopg
    mid-query on a connection not yet closed, and the ping then raises a
    ProgrammingError ("can't change 'autocommit' now") that SQLAlchemy would pass to
    the caller instead of opening another connection."""
    if context.is_pre_ping:
        context.is_disconnect = True


def _driver(conn: Connection) -> Any:
    """The sqlite3 connection under ``conn``. BEGIN goes straight to it: SQLAlchemy
    emits none for pysqlite, and a `begin` event listener would make every
    statement pay for event dispatch."""
    return conn.connection.driver_connection


class SqlStore:
    """Implements the engine's ``Store`` port on SQLAlchemy Core.

    The schema must exist: ``rift.store.migrate.upgrade(url)`` makes it.
    """

    def __init__(self, url: str, *, pool_size: int = POOL_SIZE) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=pool_size)
        self._sqlite = self.engine.dialect.name == "sqlite"

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def _answered(self) -> Iterator[None]:
        """When the database does not answer (down, restarting, a dropped
        connection, a lock given up on), read() and write() raise
        `StoreUnavailable` (503) instead of an internal error; the pool reconnects
        (pre-ping) once it answers again. SQLite's BEGIN goes straight to the
        driver and raises the driver's own errors, so those count too."""
        try:
            yield
        except DBAPIError as exc:
            if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
                raise
            self._unavailable(exc.orig or exc)
            raise StoreUnavailable() from exc
        except sqlite3.OperationalError as exc:
            self._unavailable(exc)
            raise StoreUnavailable() from exc

    def _unavailable(self, error: BaseException) -> None:
        log.warning("database unavailable", extra={
            "dialect": self.dialect, "error": str(error).strip()[:300]})

    @contextmanager
    def read(self) -> Iterator[SqlTx]:
        with self._answered(), self.engine.connect() as conn:
            if not self._sqlite:
                conn.execution_options(isolation_level="REPEATABLE READ",
                                       postgresql_readonly=True)
            with conn.begin():
                if self._sqlite:
                    _driver(conn).execute("BEGIN")
                yield SqlTx(conn, writable=False)

    @contextmanager
    def write(self) -> Iterator[SqlTx]:
        with self._answered(), self.engine.connect() as conn, conn.begin():
            if self._sqlite:
                # Take the write lock now, so writers queue on busy_timeout instead
                # of failing when a read would have to turn into a write half-way.
                _driver(conn).execute("BEGIN IMMEDIATE")
            yield SqlTx(conn, writable=True)

    def dispose(self) -> None:
        """Close every pooled connection; the store may still be used after."""
        self.engine.dispose()

    def close(self) -> None:
        self.dispose()

    def __repr__(self) -> str:
        return f"SqlStore({self.engine.url.render_as_string(hide_password=True)!r})"
