"""Replicas of `rift serve` on one PostgreSQL database and one shared host:
libvirt's test driver inside libvirtd (`test+unix:///default`), which every
client of the daemon sees alike. A plain `test:///…` URI would not do: that
driver lives inside each process, so replica B's reconciliation would find none
of the domains replica A made. libvirtd keeps the test driver's domains only
while some client is connected: a test that kills its only server keeps a
connection of its own open (tests/reliability/test_crashes.py). Each replica
has its own data dir; the database
is the throwaway one `make test` starts (RIFT_TEST_POSTGRES_URL), wiped first."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest_store import skip_without_postgres, wipe
from tests.support.servers import Server, launch, stop_server, wait_healthy

SHARED_URI = "test+unix:///default"  # the test driver inside libvirtd: one host for all


@pytest.fixture
def pg_url() -> str:
    return skip_without_postgres()


def shared_host_missing() -> str | None:
    try:
        answer = subprocess.run(["virsh", "-c", SHARED_URI, "version"], capture_output=True,
                                text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"virsh -c {SHARED_URI} failed: {exc}"
    if answer.returncode != 0:
        return (f"libvirtd does not serve the test driver on {SHARED_URI} "
                f"({answer.stderr.strip()}); scripts/libvirt.sh starts libvirtd")
    return None


def replica_env(url: str, tmp: Path, **extra: str) -> dict[str, str]:
    """One replica's environment: its own data dir, the shared database and host."""
    return {**os.environ, "RIFT_DATA_DIR": str(tmp / "data"), "RIFT_DATABASE_URL": url,
            "RIFT_HYPERVISOR_URI": SHARED_URI, "RIFT_HOST_VCPUS": "64",
            "RIFT_HOST_MEMORY_MIB": "65536", **extra}


def admin_of(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The admin's password and token, as the replica that made them printed them."""
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    password = re.search(r"password: (\S+)", lines[1])
    token = re.search(r"token:\s+(rift_\S+)", lines[2])
    assert password and token, lines
    return password.group(1), token.group(1)


@pytest.fixture
def replicas(pg_url: str, tmp_path: Path) -> Iterator[Callable[..., list[Server]]]:
    """`start(n=2, **env)`: a wiped database and `n` replicas on it (stopped after).
    The first migrates it and makes the admin; the others start once it has."""
    missing = shared_host_missing()
    if missing:
        pytest.skip(missing)
    procs: list[subprocess.Popen[str]] = []

    def start(n: int = 2, **extra: str) -> list[Server]:
        wipe(pg_url)
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




def shared_domains() -> set[str]:
    """Every domain on the shared host, running or only defined."""
    listed = subprocess.run(["virsh", "-c", SHARED_URI, "list", "--all", "--name"],
                            capture_output=True, text=True, timeout=30, check=True)
    return {line.strip() for line in listed.stdout.splitlines() if line.strip()}
