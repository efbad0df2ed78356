"""Databases for tests: the PostgreSQL leg's URL (RIFT_TEST_POSTGRES_URL), wiping
it, and an empty database of either kind. The fixtures that use these are in
tests/conftest_store.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, pool

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


def empty_database_url(kind: str, tmp_path: Path) -> str:
    """A database with no tables: a fresh SQLite file or the wiped PostgreSQL one."""
    if kind == "sqlite":
        return default_sqlite_url(tmp_path / "data")
    url = skip_without_postgres()
    wipe(url)
    return url
