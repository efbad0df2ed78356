"""Several `rift serve` replicas on one PostgreSQL database behave as one Rift
(issue 6, SPEC §9): handles and takeover across replicas, a 20-client attach race
spread over two replicas, sweeps on every replica closing each idle task once,
two replicas migrating an old schema at once, and a PostgreSQL restart mid-run.

The replicas and their shared host are tests/e2e/replicas.py (fixtures) and
tests/support/replicas.py (helpers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shlex
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError
from sqlalchemy import create_engine, pool, text

from tests.support.databases import wipe
from tests.support.mcp_clients import ERAS, call, mcp_session, refused, run
from tests.support.races import CLIENTS, race
from tests.support.replicas import admin_of, replica_env, shared_domains, shared_host_missing
from tests.support.servers import Server, launch, log_lines, stop_server, wait_healthy

MIGRATION_LOCK_ID = 0x72696674  # rift/store/alembic/env.py
SETTLE_S = 20


def rest(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url + "/api/v1", timeout=30,
                        headers={"Authorization": f"Bearer {server.token}"})


def wait_until(what: str, check: Callable[[], bool], limit_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {limit_s} s: {what}")
        time.sleep(0.2)


# -- handles and takeover across replicas -----------------------------------------------

def test_a_handle_minted_on_one_replica_works_on_the_other_and_takeover_fences_it_at_once(
        replicas: Callable[..., list[Server]]) -> None:
    # Sweeps every second on both: reconciliation runs throughout and must agree.
    a, b = replicas(RIFT_SWEEP_INTERVAL_S="1")

    async def scenario() -> None:
        async with (mcp_session(a.url, a.token, "agent-a") as on_a,
                    mcp_session(b.url, b.token, "agent-b", ERAS[1]) as on_b):
            opened = await call(on_a, "rift_task_new", name="shared")
            task_id, first = opened["task"]["id"], opened["handle"]
            # Minted on A, used on B: a read, a VM, a write.
            got = await call(on_b, "rift_task_get", handle=first)
            assert got["task"]["holder"] == "mcp:agent-a"
            vm = (await call(on_b, "rift_vm_new", handle=first, memory_mib=128))["vm"]
            assert vm["status"] == "running" and vm["host"] == "local"
            assert f"rift-{vm['id']}" in shared_domains()  # seen by every client of libvirtd
            await anyio.sleep(2.5)  # a few sweeps on each replica: nobody fails the VM
            seen = (await call(on_a, "rift_vm_get", vm_id=vm["id"]))["vm"]
            assert seen["status"] == "running", seen

            # Takeover on B fences A's handle on A at once, with no sweep in between.
            taken = await call(on_b, "rift_task_attach", task_id=task_id, takeover=True)
            assert taken["previous_holder"] == "mcp:agent-a"
            second = taken["handle"]
            stale = await refused(on_a, "lease_stale", "rift_task_get", handle=first)
            assert stale["holder"] == "mcp:agent-b"
            await refused(on_a, "lease_stale", "rift_vm_destroy", handle=first, vm_id=vm["id"])
            await refused(on_b, "lease_stale", "rift_task_release", handle=first)
            # The new handle works on both replicas.
            assert (await call(on_a, "rift_task_get", handle=second))["task"]["holder"] == \
                "mcp:agent-b"
            closed = await call(on_a, "rift_task_close", handle=second)
            assert closed["destroyed"] == [vm["id"]]
            events = await call(on_b, "rift_task_events", task_id=task_id)
            types_ = [e["type"] for e in events["events"]]
            assert types_.count("taken_over") == 1 and types_.count("stale_rejected") == 3
            assert types_.count("closed") == 1 and types_.count("vm_destroyed") == 1
            assert "vm_failed" not in types_, types_
            assert f"rift-{vm['id']}" not in shared_domains()

    run(scenario, limit_s=60)


# -- the race -------------------------------------------------------------------------

ROUNDS = 5


def test_twenty_clients_over_two_replicas_race_to_attach_and_exactly_one_wins_every_round(
        replicas: Callable[..., list[Server]]) -> None:
    a, b = replicas(RIFT_SWEEP_INTERVAL_S="1")
    assert CLIENTS == 20

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            owners = [await stack.enter_async_context(mcp_session(s.url, s.token, "owner"))
                      for s in (a, b)]
            # Even racers on A, odd on B; both protocol eras on each replica.
            racers = [await stack.enter_async_context(mcp_session(
                (a, b)[n % 2].url, a.token, f"racer-{n}", ERAS[(n // 2) % 2]))
                for n in range(CLIENTS)]
            for round_ in range(ROUNDS):
                await race(owners[round_ % 2], racers)

    run(scenario, limit_s=90)


# -- a pool shared by replicas ----------------------------------------------------------

def _pool_ready(server: Server) -> int:
    listed = server.rift("pool", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return sum(row["running"]["ready"] for row in json.loads(listed.stdout))


def test_twenty_vm_news_over_two_replicas_share_a_pool_of_two_and_each_vm_goes_once(
        replicas: Callable[..., list[Server]]) -> None:
    a, b = replicas(RIFT_SWEEP_INTERVAL_S="1")
    made = a.rift("pool", "set", "tiny", "--running", "2")
    assert made.returncode == 0, made.stderr
    wait_until("the pool is filled", lambda: _pool_ready(a) == 2)
    pooled = {name for name in shared_domains() if name.startswith("rift-")}
    assert len(pooled) == 2

    async def scenario() -> list[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            sessions = [await stack.enter_async_context(mcp_session(
                (a, b)[n % 2].url, a.token, f"agent-{n}", ERAS[(n // 2) % 2]))
                for n in range(CLIENTS)]
            handles = [(await call(s, "rift_task_new", name=f"t{n}"))["handle"]
                       for n, s in enumerate(sessions)]
            go = anyio.Event()
            answers: dict[int, dict[str, Any]] = {}

            async def new(n: int) -> None:
                await go.wait()
                answers[n] = (await call(sessions[n], "rift_vm_new", handle=handles[n],
                                         image="tiny"))["vm"]

            async with anyio.create_task_group() as tg:
                for n in range(CLIENTS):
                    tg.start_soon(new, n)
                await anyio.sleep(0.05)
                go.set()
            return list(answers.values())

    vms = run(scenario, limit_s=120)
    assert len(vms) == CLIENTS and all(vm["status"] == "running" for vm in vms)
    assert len({vm["id"] for vm in vms}) == CLIENTS
    from_pool = [vm for vm in vms if vm["start"]["kind"] == "pool"]
    # Each pooled VM went to exactly one task (the pool may refill during the rush, and
    # a refilled VM may be handed out too); the rest booted; nothing failed.
    assert len(from_pool) >= len(pooled)
    assert len({vm["task_id"] for vm in from_pool}) == len(from_pool)
    assert Counter(vm["start"]["kind"] for vm in vms) == {
        "pool": len(from_pool), "boot": CLIENTS - len(from_pool)}
    # The pool refills in the background, and every domain is a VM's or the pool's.
    wait_until("the pool is filled again", lambda: _pool_ready(b) == 2)
    domains = {name for name in shared_domains() if name.startswith("rift-")}
    assert {f"rift-{vm['id']}" for vm in vms} <= domains and len(domains) == CLIENTS + 2
    assert pooled <= domains


# -- sweeps on every replica ------------------------------------------------------------

TASKS = 8


def test_sweeps_run_on_every_replica_and_close_each_idle_task_once(
        replicas: Callable[..., list[Server]]) -> None:
    a, b = replicas(RIFT_SWEEP_INTERVAL_S="1", RIFT_TASK_IDLE_S="3")
    # A host nobody can reach (and too small for any VM): every sweep of every
    # replica tries it and says so, and the sweep goes on (idle closes too).
    added = a.rift("host", "add", "ghost", "test+unix:///default?socket=/nonexistent/sock",
                   "--vcpus", "1", "--memory-mib", "64")
    assert added.returncode == 0, added.stderr

    made: dict[str, str] = {}  # task id -> its VM id
    clients = [rest(a), rest(b)]
    with ExitStack() as stack:
        for client in clients:
            stack.enter_context(client)
        for n in range(TASKS):  # staggered, through both replicas
            api = clients[n % 2]
            opened = api.post("/tasks", json={"name": f"idle-{n}"}).json()
            vm = api.post(f"/tasks/{opened['task']['id']}/vms",
                          headers={"Rift-Handle": opened["handle"]}, json={})
            assert vm.status_code == 201 and vm.json()["vm"]["status"] == "running", vm.text
            made[opened["task"]["id"]] = vm.json()["vm"]["id"]
            time.sleep(0.25)

        def all_closed() -> bool:
            return all(clients[0].get(f"/tasks/{t}").json()["task"]["status"] == "closed"
                       for t in made)

        wait_until("every idle task closed", all_closed)
        time.sleep(2.5)  # more sweeps on both: nothing closes or destroys twice
        for n, (task_id, vm_id) in enumerate(made.items()):
            api = clients[n % 2]
            task = api.get(f"/tasks/{task_id}").json()["task"]
            assert task["close_reason"] == "idle", task
            events = api.get(f"/tasks/{task_id}/events").json()["events"]
            kinds = Counter(e["type"] for e in events)
            assert kinds["closed"] == 1 and kinds["vm_destroyed"] == 1, events
            assert kinds["vm_failed"] == 0, events
            closing = next(e for e in events if e["type"] == "closed")
            assert closing["actor"] == "sweep" and closing["details"]["vms"] == [vm_id]
            assert api.get(f"/vms/{vm_id}").json()["vm"]["status"] == "destroyed"
    assert not {f"rift-{vm_id}" for vm_id in made.values()} & shared_domains()

    logs = {s.url: log_lines(s.log) for s in (a, b)}
    # Each replica swept (each met the unreachable host, every second) ...
    for url, lines in logs.items():
        tried = [x for x in lines if x["msg"] == "host unreachable" and x.get("host") == "ghost"]
        assert len(tried) >= 3, f"no sweeps on the replica at {url}"
    # ... and between them the sweeps closed each task once.
    closes = sum(x.get("closed", 0) for lines in logs.values() for x in lines
                 if x["msg"] == "sweep")
    assert closes == TASKS


# -- an older schema, two replicas at once ------------------------------------------------

def test_two_replicas_started_at_once_on_an_old_schema_one_migrates_the_other_waits(
        pg_url: str, tmp_path: Path) -> None:
    from rift.store.migrate import current_revision, head_revision, upgrade

    missing = shared_host_missing()
    if missing:
        pytest.skip(missing)
    wipe(pg_url)
    upgrade(pg_url, "0001")
    assert current_revision(pg_url) == "0001"
    engine = create_engine(pg_url, poolclass=pool.NullPool)
    started: list[tuple[subprocess.Popen[str], Server]] = []
    try:
        with engine.connect() as holder:
            # Hold the migration lock, so both replicas surely queue for it together.
            holder.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            holder.commit()
            for i in range(2):
                tmp = tmp_path / f"r{i}"
                tmp.mkdir()
                env = replica_env(pg_url, tmp)
                proc, url = launch(env, tmp / "server.log", admin_lines=True)
                started.append((proc, Server(url, "", "", tmp / "data", env,
                                             tmp / "server.log")))

            def both_waiting() -> bool:
                with engine.connect() as probe:
                    return probe.scalar(text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND objid = :id AND NOT granted"), {"id": MIGRATION_LOCK_ID}) == 2

            wait_until("both replicas waiting on the migration lock", both_waiting, 60)
            assert current_revision(pg_url) == "0001"
            assert all(proc.poll() is None for proc, _ in started)
            holder.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
            holder.commit()
        for proc, server in started:
            wait_healthy(proc, server.url, server.log)
        assert current_revision(pg_url) == head_revision()
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM users")) == 1  # one admin
            assert conn.scalar(text("SELECT count(*) FROM hosts")) == 1  # one `local`
            assert conn.scalar(text("SELECT count(*) FROM meta WHERE key = 'install_id'")) == 1
        # Exactly one of them made (and printed) the admin; both answer its token.
        printed = [proc for proc, _ in started
                   if proc.stdout and select.select([proc.stdout], [], [], 0)[0]]
        assert len(printed) == 1, "the admin must be made once"
        _password, token = admin_of(printed[0])
        first, second = (dataclasses.replace(server, token=token) for _, server in started)
        with rest(first) as on_first, rest(second) as on_second:
            opened = on_first.post("/tasks", json={"name": "after migration"}).json()
            got = on_second.get(f"/tasks/{opened['task']['id']}",
                                headers={"Rift-Handle": opened["handle"]})
            assert got.status_code == 200, got.text
        for _proc, server in started:
            assert "Traceback" not in server.log.read_text()
    finally:
        for proc, _server in started:
            stop_server(proc)
        engine.dispose()


# -- PostgreSQL restarted mid-run --------------------------------------------------------

class LocalPostgres:
    """The PostgreSQL server behind `url`, when it runs on this machine (as
    scripts/pg.sh starts it): stopped and started again with pg_ctl, data kept."""

    def __init__(self, url: str) -> None:
        engine = create_engine(url, poolclass=pool.NullPool)
        try:
            with engine.connect() as conn:
                self.data_dir = Path(str(conn.scalar(text("SHOW data_directory"))))
                major = int(str(conn.scalar(text("SHOW server_version_num")))) // 10000
        finally:
            engine.dispose()
        self.bin = Path(f"/usr/lib/postgresql/{major}/bin")
        opts_file = self.data_dir / "postmaster.opts"
        if not (self.bin / "pg_ctl").exists() or not opts_file.exists():
            pytest.skip(f"the PostgreSQL at {url} is not one this machine can restart "
                        f"(no {self.bin}/pg_ctl or {opts_file})")
        argv = shlex.split(opts_file.read_text())[1:]
        if "-D" in argv:
            at = argv.index("-D")
            del argv[at:at + 2]
        self.options = shlex.join(argv)
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _pg_ctl(self, *args: str) -> None:
        # No pipes: the server would inherit them and hold them open.
        subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data_dir),
                        *args], check=True, timeout=60, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        self._pg_ctl("-l", str(self.data_dir / "log"), "-w", "-t", "30", "-o", self.options,
                     "start")


class Loader(threading.Thread):
    """Takes a task over and over through one replica (REST), noting each answer."""

    def __init__(self, server: Server, task_id: str) -> None:
        super().__init__(daemon=True)
        self.server, self.task_id = server, task_id
        self.answers: list[tuple[int, str | None]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with rest(self.server) as api:
            while not self.halt.is_set():
                try:
                    got = api.post(f"/tasks/{self.task_id}/attach", json={"takeover": True},
                                   timeout=10)
                except httpx.HTTPError as exc:
                    self.answers.append((0, type(exc).__name__))
                    continue
                code = None if got.status_code == 200 else got.json()["error"]["code"]
                self.answers.append((got.status_code, code))
                time.sleep(0.01)


def test_postgresql_restarted_mid_run_rift_reconnects_and_loses_nothing(
        replicas: Callable[..., list[Server]], pg_url: str) -> None:
    postgres = LocalPostgres(pg_url)
    a, b = replicas(RIFT_SWEEP_INTERVAL_S="1")
    statuses: list[int] = []  # every HTTP answer the MCP client got

    async def scenario() -> None:
        async with mcp_session(b.url, b.token, "agent", statuses=statuses) as agent:
            with rest(a) as on_a, rest(b) as on_b:
                await outage(postgres, a, b, agent, on_a, on_b, statuses)

    run(scenario, limit_s=90)
    for server in (a, b):
        unexpected = [x for x in log_lines(server.log) if x.get("level") == "error"
                      and x["msg"] != "sweep failed"]
        assert not unexpected, unexpected


async def outage(postgres: LocalPostgres, a: Server, b: Server, agent: Any,
                 on_a: httpx.Client, on_b: httpx.Client, statuses: list[int]) -> None:
    opened = await call(agent, "rift_task_new", name="kept")
    kept_id, kept_handle = opened["task"]["id"], opened["handle"]
    vm = (await call(agent, "rift_vm_new", handle=kept_handle))["vm"]
    before = on_a.get(f"/tasks/{kept_id}/events").json()["events"]
    # Takeovers all along, through both replicas, each on a task of its own.
    loaders = [Loader(s, api.post("/tasks", json={"name": "busy"}).json()["task"]["id"])
               for s, api in ((a, on_a), (b, on_b))]
    for loader in loaders:
        loader.start()
    await anyio.sleep(0.5)

    await anyio.to_thread.run_sync(postgres.stop)
    try:
        await anyio.sleep(1.0)  # the loaders meet the outage meanwhile
        down = [on_a.get(f"/tasks/{kept_id}", headers={"Rift-Handle": kept_handle}),
                on_b.post("/tasks", json={"name": "during"}),
                on_a.post(f"/tasks/{kept_id}/release", headers={"Rift-Handle": kept_handle})]
        health = [httpx.get(s.url + "/healthz", timeout=10).status_code for s in (a, b)]
        with pytest.raises(MCPError):  # the SDK raises on an HTTP error answer
            await agent.call_tool("rift_task_get", {"handle": kept_handle})
        mcp_status = statuses[-1]
    finally:
        await anyio.to_thread.run_sync(postgres.start)
    await anyio.sleep(1.0)  # the loaders come back
    for loader in loaders:
        loader.halt.set()
        loader.join(timeout=20)

    # During the outage: a clean 503 (code `internal`, naming the database), no 500.
    for answer in down:
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "internal" and "database" in error["message"], error
    assert health == [503, 503]
    assert mcp_status == 503, statuses
    answers = [x for loader in loaders for x in loader.answers]
    assert {status for status, _ in answers} <= {200, 503}, Counter(answers)
    assert (503, "internal") in answers, Counter(answers)
    assert all(loader.answers[-1] == (200, None) for loader in loaders), \
        [loader.answers[-5:] for loader in loaders]

    # After it: the same MCP session and both replicas answer, and everything
    # committed before the outage is there.
    task = (await call(agent, "rift_task_get", handle=kept_handle))["task"]
    assert task["holder"] == "mcp:agent" and [v["id"] for v in task["vms"]] == [vm["id"]]
    assert task["vms"][0]["status"] == "running"
    after = on_a.get(f"/tasks/{kept_id}/events").json()["events"]
    assert after[:len(before)] == before
    # Every acknowledged takeover is recorded; one whose answer the outage cut off
    # may be recorded too (it committed, the client never heard).
    for loader in loaders:
        recorded = sum(e["type"] == "taken_over" for e in all_events(on_b, loader.task_id))
        acknowledged = sum(status == 200 for status, _ in loader.answers)
        cut = sum(status == 503 for status, _ in loader.answers)
        assert acknowledged <= recorded <= acknowledged + cut, (acknowledged, recorded, cut)
    closed = await call(agent, "rift_task_close", handle=kept_handle)
    assert closed["destroyed"] == [vm["id"]]


def all_events(api: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after_id = 0
    while True:
        page = api.get(f"/tasks/{task_id}/events",
                       params={"after_id": after_id, "limit": 100}).json()
        events += page["events"]
        if not page["has_more"]:
            return events
        after_id = page["next_after"]
