"""Scale-out benchmark (issue 6): lease operations per second and attach latency
under 32 concurrent clients, for one `rift serve` on SQLite, one on PostgreSQL
and two replicas on one PostgreSQL, side by side in one run.

A first column gives one client alone (no queueing): the cost of one attach.

Each replica is a real `rift serve` child process (one uvicorn worker, a private
libvirt test-driver host each: no VMs are made, so the replicas need no shared
hypervisor here; see tests/e2e/test_replicas.py for when they do). The clients speak REST (`POST
/api/v1/tasks/{id}/attach` with `takeover`, httpx.AsyncClient, one process),
spread round-robin over the replicas. Two loads, 32 clients each:

- spread: every client takes over its own task, over and over: what the
  control plane sustains when agents work on different tasks;
- one task: all 32 take over the same task: every attach is a compare-and-set
  on one row, across replicas; `lost` counts attaches whose eight
  compare-and-set attempts all lost (answered `task_held`).

PostgreSQL is RIFT_TEST_POSTGRES_URL when set (its database is wiped), else a
throwaway server that `scripts/pg.sh` starts in its own directory and port and
stops after. Both stores commit without fsync here (pg.sh runs PostgreSQL with
fsync=off; SQLite runs WAL with synchronous=NORMAL).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common import print_table, work_dir
from hypervisor import write_test_host_xml

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = 32
WARMUP_S = 2.0
MEASURE_S = 8.0
START_S = 60


@dataclass
class Load:
    ok: int
    lost: int
    seconds: float
    latencies: list[float]

    @property
    def per_s(self) -> float:
        return self.ok / self.seconds

    def quantile_ms(self, q: int) -> float:
        return statistics.quantiles(self.latencies, n=100)[q - 1] * 1000


# -- PostgreSQL ---------------------------------------------------------------------

@contextmanager
def postgres() -> Iterator[str]:
    """RIFT_TEST_POSTGRES_URL, or a throwaway server of scripts/pg.sh's own."""
    url = os.environ.get("RIFT_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    env = dict(os.environ, RIFT_PG_DIR=tempfile.mkdtemp(prefix="rift-bench-pg-"),
               RIFT_PG_PORT=str(_free_port()))
    made = subprocess.run([str(ROOT / "scripts" / "pg.sh"), "start"], env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    if made.returncode != 0:
        raise RuntimeError(f"scripts/pg.sh start failed: {made.stderr.strip()}")
    try:
        yield made.stdout.strip()
    finally:
        subprocess.run([str(ROOT / "scripts" / "pg.sh"), "stop"], env=env, check=False,
                       timeout=120, capture_output=True)


def _wipe(url: str) -> None:
    from tests.support.databases import wipe  # the suite's own: drop every table

    wipe(url)


# -- replicas -----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def replicas(n: int, database_url: str | None) -> Iterator[tuple[list[str], str]]:
    """`n` `rift serve` processes on one database (SQLite in the first data dir when
    `database_url` is None); answers their URLs and the admin's token."""
    from tests.support.servers import stop_server  # the suite's own: terminate, then kill

    procs: list[subprocess.Popen[str]] = []
    with work_dir("rift-bench-") as tmp:
        try:
            urls, token = [], ""
            for i in range(n):
                data = Path(tmp) / f"r{i}"
                data.mkdir()
                env = dict(os.environ, RIFT_DATA_DIR=str(data), RIFT_LOG_LEVEL="WARNING",
                           RIFT_HYPERVISOR_URI=write_test_host_xml(
                               str(data / "node.xml"), 64, 262144),
                           RIFT_MAX_OPEN_TASKS="1000", RIFT_RATE_TASK_NEW_PER_H="1000000",
                           RIFT_SWEEP_INTERVAL_S="3600")
                if database_url:
                    env["RIFT_DATABASE_URL"] = database_url
                port = _free_port()
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rift.cli", "serve", "--port", str(port)],
                    stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                    stderr=(data / "server.log").open("w"), env=env, text=True)
                procs.append(proc)
                if i == 0:
                    assert proc.stdout is not None
                    lines = [proc.stdout.readline() for _ in range(3)]
                    found = re.search(r"token:\s+(rift_\S+)", lines[2])
                    if found is None:
                        raise RuntimeError(f"rift serve printed no admin: {lines}")
                    token = found.group(1)
                urls.append(f"http://127.0.0.1:{port}")
            for proc, url in zip(procs, urls, strict=True):
                _wait_healthy(proc, url)
            yield urls, token
        finally:
            for proc in procs:
                stop_server(proc)


def _wait_healthy(proc: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rift serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"rift serve did not answer /healthz within {START_S} s")


# -- the load -------------------------------------------------------------------------

async def _load(urls: list[str], token: str, one_task: bool, clients_n: int = CLIENTS) -> Load:
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    clients = [httpx.AsyncClient(base_url=url + "/api/v1", headers=headers, timeout=60,
                                 limits=limits) for url in urls]
    try:
        tasks = []
        for n in range(1 if one_task else clients_n):
            made = await clients[n % len(clients)].post("/tasks", json={"name": f"bench-{n}"})
            made.raise_for_status()
            tasks.append(made.json()["task"]["id"])
        latencies: list[float] = []
        counts = {"ok": 0, "lost": 0}
        phase = {"measuring": False, "stop": False}

        async def client(n: int) -> None:
            api = clients[n % len(clients)]
            path = f"/tasks/{tasks[0 if one_task else n]}/attach"
            while not phase["stop"]:
                start = time.perf_counter()
                answer = await api.post(path, json={"takeover": True})
                took = time.perf_counter() - start
                if answer.status_code == 200:
                    outcome = "ok"
                elif answer.status_code == 409 and answer.json()["error"]["code"] == "task_held":
                    outcome = "lost"
                else:
                    raise RuntimeError(f"attach answered {answer.status_code}: {answer.text}")
                if phase["measuring"]:
                    counts[outcome] += 1
                    latencies.append(took)

        runners = [asyncio.create_task(client(n)) for n in range(clients_n)]
        await asyncio.sleep(WARMUP_S)
        phase["measuring"] = True
        began = time.perf_counter()
        await asyncio.sleep(MEASURE_S)
        phase["measuring"] = False
        seconds = time.perf_counter() - began
        phase["stop"] = True
        await asyncio.gather(*runners)
        return Load(counts["ok"], counts["lost"], seconds, latencies)
    finally:
        for c in clients:
            await c.aclose()


def _measure(label: str, n: int, database_url: str | None) -> tuple[str, Load, Load, Load]:
    if database_url:
        _wipe(database_url)
    with replicas(n, database_url) as (urls, token):
        alone = asyncio.run(_load(urls, token, one_task=False, clients_n=1))
        spread = asyncio.run(_load(urls, token, one_task=False))
        contended = asyncio.run(_load(urls, token, one_task=True))
    return label, alone, spread, contended


def main() -> None:
    print(f"# Rift scale-out benchmark ({os.cpu_count()} CPUs here, load average "
          f"{os.getloadavg()[0]:.1f} at the start; clients, replicas and PostgreSQL share them)")
    with postgres() as pg_url:
        results = [
            _measure("1 replica, SQLite", 1, None),
            _measure("1 replica, PostgreSQL", 1, pg_url),
            _measure("2 replicas, one PostgreSQL", 2, pg_url),
        ]
    rows: list[tuple[str, ...]] = []
    for label, alone, spread, contended in results:
        rows.append((label, f"{alone.quantile_ms(50):.1f}",
                     f"{spread.per_s:,.0f}", f"{spread.quantile_ms(50):.1f}",
                     f"{spread.quantile_ms(99):.1f}", f"{contended.per_s:,.0f}",
                     f"{contended.quantile_ms(99):.1f}", str(contended.lost)))
    print_table(
        f"Attach with takeover over REST, {CLIENTS} concurrent clients, "
        f"{MEASURE_S:g} s after {WARMUP_S:g} s warm-up",
        rows, ("setup", "1 client: p50 ms", "spread: attach/s", "p50 ms", "p99 ms",
               "one task: attach/s", "p99 ms", "lost"))


if __name__ == "__main__":
    main()
