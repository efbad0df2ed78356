"""Databases for tests: the PostgreSQL leg's URL (RIFT_TEST_POSTGRES_URL), wiping
it, emptying its migrated tables, and an empty database of either kind. The
fixtures that use these are in tests/conftest_store.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import MetaData, Table, create_engine, pool, text

from rift.store.migrate import current_revision, head_revision, upgrade
from rift.store.sql import default_sqlite_url

POSTGRES_ENV = "RIFT_TEST_POSTGRES_URL"
SQL_KINDS = ("sqlite", "postgresql")


def postgres_url() -> str | None:
    return os.environ.get(POSTGRES_ENV) or None


def skip_without_postgres() -> str:
    url = postgres_url()
    if url is None:
        pytest.skip(
            f"the PostgreSQL leg runs when {POSTGRES_ENV} is set, e.g. "
            "postgresql+psycopg://postgres@127.0.0.1:55432/rift_test"
        )
    return url


def wipe(url: str) -> None:
    """Drop every table of the database at ``url`` (alembic_version too)."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        found = MetaData()
        found.reflect(engine)
        found.drop_all(engine)
    finally:
        engine.dispose()


@dataclass(frozen=True)
class _Migrated:
    """A database as this process's migration of it left it: its tables (children
    first), sequences, and the rows the migrations themselves wrote (0003's install
    id)."""

    tables: list[Table]
    sequences: list[str]
    rows: dict[str, list[dict[str, object]]]


_migrated: dict[str, _Migrated] = {}  # by database URL


def migrated_and_empty(url: str) -> None:
    """Bring the PostgreSQL database at ``url`` to the newest revision holding only
    the migrations' own rows. A database this process migrated, still at the newest
    revision, is emptied in one transaction (about 20 ms: rows deleted, sequences
    restarted) rather than dropped and migrated again (about 700 ms each: a minute
    of the PostgreSQL leg); any other is wiped and migrated."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        known = _migrated.get(url)
        if known is not None and current_revision(url) == head_revision():
            with engine.begin() as connection:
                for table in known.tables:
                    connection.execute(table.delete())
                for sequence in known.sequences:
                    connection.execute(text(f'ALTER SEQUENCE "{sequence}" RESTART'))
                for table in known.tables:
                    if table.name in known.rows:
                        connection.execute(table.insert(), known.rows[table.name])
            return
        wipe(url)
        upgrade(url)
        with engine.connect() as connection:
            found = MetaData()
            found.reflect(connection)
            tables = [t for t in reversed(found.sorted_tables) if t.name != "alembic_version"]
            rows = {t.name: [dict(row._mapping) for row in connection.execute(t.select())]
                    for t in tables}
            sequences = [name for (name,) in connection.execute(text(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"))]
        _migrated[url] = _Migrated(tables, sequences,
                                   {name: got for name, got in rows.items() if got})
    finally:
        engine.dispose()


def empty_database_url(kind: str, tmp_path: Path) -> str:
    """A database with no tables: a fresh SQLite file or the wiped PostgreSQL one."""
    if kind == "sqlite":
        return default_sqlite_url(tmp_path / "data")
    url = skip_without_postgres()
    wipe(url)
    return url
