"""Stores for tests, as a pytest plugin: ``pytest_plugins = ["tests.conftest_store"]``.

``store`` runs a test once per kind of store: ``memory``, ``sqlite`` (a file
in the test's tmp_path) and ``postgresql`` when ``RIFT_TEST_POSTGRES_URL``
names a database (``postgresql+psycopg://user@host:port/db``). That database
is wiped: every table in it is dropped before each test and the migrations
are run again, so each test starts from an empty schema.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, pool

from rift.services.ports import Store
from rift.store.memory import MemoryStore
from rift.store.migrate import upgrade
from rift.store.sql import SqlStore, default_sqlite_url

POSTGRES_ENV = "RIFT_TEST_POSTGRES_URL"
STORE_KINDS = ("memory", "sqlite", "postgresql")
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


def empty_database_url(kind: str, tmp_path: Path) -> str:
    """A database with no tables: a fresh SQLite file or the wiped PostgreSQL one."""
    if kind == "sqlite":
        return default_sqlite_url(tmp_path / "data")
    url = skip_without_postgres()
    wipe(url)
    return url


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if kind == "postgresql":
        skip_without_postgres()
    return kind


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[Store]:
    """An empty, migrated store of each kind."""
    if store_kind == "memory":
        made: Store = MemoryStore()
    else:
        url = empty_database_url(store_kind, tmp_path)
        upgrade(url)
        made = SqlStore(url)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=SQL_KINDS)
def empty_sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty SQL database of each kind, not yet migrated."""
    return empty_database_url(str(request.param), tmp_path)
