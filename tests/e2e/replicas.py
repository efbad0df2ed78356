"""Replicas of `rift serve` on one PostgreSQL database and one shared host:
libvirt's test driver inside libvirtd (`test+unix:///default`), which every
client of the daemon sees alike. A plain `test:///…` URI would not do: that
driver lives inside each process, so replica B's reconciliation would find none
of the domains replica A made. libvirtd keeps the test driver's domains only
while some client is connected: a test that kills its only server keeps a
connection of its own open (tests/reliability/test_crashes.py). Each replica
has its own data dir; the database
is the throwaway one `make test` starts (RIFT_TEST_POSTGRES_URL), emptied first.
These are the fixtures (a plugin of tests/conftest.py); the helpers are
tests/support/replicas.py."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.databases import migrated_and_empty, skip_without_postgres
from tests.support.replicas import admin_of, replica_env, shared_host_missing
from tests.support.servers import Server, launch, stop_server, wait_healthy


@pytest.fixture
def pg_url() -> str:
    return skip_without_postgres()


@pytest.fixture
def replicas(pg_url: str, tmp_path: Path) -> Iterator[Callable[..., list[Server]]]:
    """`start(n=2, **env)`: a database with no rows, migrated, and `n` replicas on it
    (stopped after). The first makes the admin; the others start once it has."""
    missing = shared_host_missing()
    if missing:
        pytest.skip(missing)
    procs: list[subprocess.Popen[str]] = []

    def start(n: int = 2, **extra: str) -> list[Server]:
        migrated_and_empty(pg_url)
        started = []
        for i in range(n):
            tmp = tmp_path / f"r{i}"
            tmp.mkdir()
            env = replica_env(pg_url, tmp, **extra)
            proc, url = launch(env, tmp / "server.log", admin_lines=i == 0)
            procs.append(proc)
            if i == 0:
                password, token = admin_of(proc)
            started.append((proc, Server(url, token, password, tmp / "data", env,
                                         tmp / "server.log")))
        for proc, server in started:
            wait_healthy(proc, server.url, server.log)
        return [server for _proc, server in started]

    try:
        yield start
    finally:
        for proc in procs:
            stop_server(proc)
