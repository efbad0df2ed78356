"""Stores for tests, as a pytest plugin: ``pytest_plugins = ["tests.conftest_store"]``.

There is one store, SQL. ``store`` runs a test once per database: ``sqlite``
(a file in the test's tmp_path) and ``postgresql`` when
``RIFT_TEST_POSTGRES_URL`` names a database
(``postgresql+psycopg://user@host:port/db``). Each test starts from that database
migrated to the newest revision with no rows but the migrations' own: emptied by
one TRUNCATE when it is already there, else wiped and migrated
(tests.support.databases.migrated_and_empty).

A migrated SQLite database is made once per test session (``sqlite_template``)
and copied for each store a test asks for (``sqlite_url``, ``new_sqlite_url``):
a file copy instead of running the migrations again, the way cosmicpython's
tests/conftest.py builds its schema once per session.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rift.services.ports import Store
from rift.store.migrate import upgrade
from rift.store.sql import SqlStore
from tests.support.databases import (
    SQL_KINDS,
    empty_database_url,
    migrated_and_empty,
    skip_without_postgres,
)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to the newest revision, made once per session."""
    path = tmp_path_factory.mktemp("sqlite-template") / "rift.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def new_sqlite_url(sqlite_template: Path, tmp_path: Path) -> Callable[[], str]:
    """Makes a fresh copy of the migrated template in the test's tmp_path, one per call."""
    numbers = itertools.count()

    def make() -> str:
        folder = tmp_path / f"sqlite-{next(numbers)}"
        folder.mkdir()
        copy = folder / "rift.db"
        shutil.copyfile(sqlite_template, copy)
        return f"sqlite:///{copy}"

    return make


@pytest.fixture
def sqlite_url(new_sqlite_url: Callable[[], str]) -> str:
    """A migrated, empty SQLite database of the test's own."""
    return new_sqlite_url()


@pytest.fixture(params=SQL_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if kind == "postgresql":
        skip_without_postgres()
    return kind


@pytest.fixture
def store(store_kind: str, new_sqlite_url: Callable[[], str]) -> Iterator[Store]:
    """An empty, migrated store on each database."""
    if store_kind == "sqlite":
        url = new_sqlite_url()
    else:
        url = skip_without_postgres()
        migrated_and_empty(url)
    made = SqlStore(url)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=SQL_KINDS)
def empty_sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty SQL database of each kind, not yet migrated."""
    return empty_database_url(str(request.param), tmp_path)
