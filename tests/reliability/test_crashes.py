"""Crashes (issue 7): `kill -9` of `rift serve` at random moments during
`rift_vm_new`, `rift_vm_destroy`, `rift_task_close` and the sweep, then a restart
on the same data dir. After each restart and its reconciliation, every domain of
the installation on every host has a live VM row, every `running` row its
running domain, every state change (of a VM, of a task's lease) its event, every
close the kill cut is finished, and every VM destroy it cut ends `destroyed` with
its one `vm_destroyed`, never `failed` (`untruths` counts what breaks the promise;
the figures are recorded, then asserted to be 0).

- **On libvirt's test driver** inside libvirtd (`test+unix:///default`; a plain
  `test:///` host lives in the server's process and dies with it): one server,
  killed and restarted trial after trial on the same data dir, while agents (four
  over REST, one over MCP) open tasks, make VMs, release and attach or take over
  tasks, destroy VMs, close tasks and leave others to go idle for the sweep. Each
  trial aims its kill at one of the four (in turn): it waits a random time, then
  until one is under way, then a few random milliseconds more. A kill can come
  just after the work it aimed at ended; while no kill has left a create, a close
  or an idle close half done, up to six more trials aim at it. When the kill cut
  closes, half the time the restart is killed too, in the middle of its start-up
  pass (the sweep it runs before taking calls), and started again.
- **With real QEMU guests** (`tiny` under TCG on qemu:///system): each trial boots
  guests and cuts one of the four while it acts on them (during the boot of
  `rift_vm_new`, with a domain made behind Rift's back while it is down; during a
  close's destroys; during an idle close's destroys by the sweep; during a VM's
  destroy), then checks that no guest, key or serial log outlives its task.

The seed of the random moments is printed and recorded; `RIFT_CRASH_SEED=N`
replays a campaign's choices (thread timing still varies). `RIFT_SOAK=1` runs the
long form: 50 test-driver trials and 5 real-guest trials.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx
import pytest

from tests.support import campaign
from tests.support.mcp_clients import call, mcp_session, run
from tests.support.replicas import SHARED_URI, shared_host_missing
from tests.support.servers import (
    REAL_URI,
    Server,
    kill_server,
    launch,
    real_vms_missing,
    restart_server,
    start_real_server,
    start_server,
    stop_server,
    wait_until,
)
from tests.support.witnesses import (
    LIVE,
    Untruths,
    define_and_start,
    events,
    foreign_domain,
    install_id,
    new_vm_id,
    our_domains,
    remove_domain,
    rows,
    untruths,
    vm_rows,
)

SECTION = "Crashes"
KINDS = ("vm_new", "vm_destroy", "task_close", "sweep")
SHOWN = {"vm_new": "vm new", "vm_destroy": "vm destroy", "task_close": "task close",
         "sweep": "sweep"}
TEST_DRIVER_TRIALS = campaign.scale(8, 50)
# Kinds some kill must leave half done. A kill aimed at one can come just after its
# work ends (on a busy machine more often), so up to this many more trials aim at
# a kind still uncut before the campaign says it did not cut it.
MUST_CUT = ("vm_new", "task_close", "sweep")
EXTRA_TRIALS = 6
REAL_TRIALS = campaign.scale(2, 5)
REAL_KINDS = ("vm_new", "task_close", "vm_destroy", "sweep")  # trial i: REAL_KINDS[i % 4]
AGENTS = 5  # per test-driver trial: four over REST, the last over MCP
AIM_S = 8  # how long a trial waits for its kind of work to be under way
JOIN_S = 30
LIMIT_S = 120  # any one real-guest scenario
BOOT_S = 60  # real guests' boot wait while they must come up
GRACE_S = 6  # the creating grace after a restart (above the shortest boot wait, 5 s)

UNLIMITED = {"RIFT_RATE_TASK_NEW_PER_H": "1000000", "RIFT_RATE_VM_NEW_PER_H": "1000000",
             "RIFT_MAX_OPEN_TASKS": "100000", "RIFT_MAX_VMS_PER_TASK": "16"}
# One server on the shared test host: sweeps every second, tasks quiet for 2 s close,
# a `creating` row 6 s old is a create that died.
TEST_DRIVER_ENV = {**UNLIMITED, "RIFT_HYPERVISOR_URI": SHARED_URI, "RIFT_HOST_VCPUS": "100000",
                   "RIFT_HOST_MEMORY_MIB": "100000000", "RIFT_SWEEP_INTERVAL_S": "1",
                   "RIFT_TASK_IDLE_S": "2", "RIFT_ACTIVITY_STEP_S": "1",
                   "RIFT_VM_BOOT_TIMEOUT_S": "5", "RIFT_VM_CREATING_GRACE_S": str(GRACE_S)}
# Real guests: a generous boot wait while they come up; after a crash, a short grace.
REAL_ENV = {"RIFT_VM_BOOT_TIMEOUT_S": str(BOOT_S), "RIFT_VM_CREATING_GRACE_S": "600",
            "RIFT_SWEEP_INTERVAL_S": "1", "RIFT_TASK_IDLE_S": "14400",
            "RIFT_ACTIVITY_STEP_S": "1"}
RECOVER_ENV = {**REAL_ENV, "RIFT_VM_BOOT_TIMEOUT_S": "5",
               "RIFT_VM_CREATING_GRACE_S": str(GRACE_S)}
POOL_IMAGE = "debian"  # the default image, which the test-driver agents' VMs are
IDLE_S = 8  # the real sweep trial: the task closes itself this long after its last call


def campaign_seed() -> int:
    seed = int(os.environ.get("RIFT_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash campaign seed: RIFT_CRASH_SEED={seed}")
    return seed


# -- the tally ----------------------------------------------------------------------------

@dataclass
class Tally:
    """Every trial's findings, counted over the campaign before anything is asserted."""

    trials: int = 0
    aimed: Counter[str] = field(default_factory=Counter)  # kind → kills that found it under way
    in_flight: Counter[str] = field(default_factory=Counter)  # kind → kills with a call of it open
    cut: Counter[str] = field(default_factory=Counter)  # kind → kills that left it half done
    kills_in_flight: int = 0  # kills with any call in flight
    kills_cutting: int = 0  # kills that left any work half done
    start_up_kills: int = 0  # second kills, while a restart's start-up pass finished closes
    creates_cut: set[str] = field(default_factory=set)  # VMs `creating` at a kill
    destroys_cut: set[str] = field(default_factory=set)  # `running` VMs with no running domain
    leaked: list[str] = field(default_factory=list)
    lying: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # closes a restart left unfinished
    # Destroys a kill cut (after libvirt, before the row) that a restart did not end
    # `destroyed` with one `vm_destroyed`: failed, or blamed on something outside Rift.
    destroys_not_destroyed: list[str] = field(default_factory=list)

    def found(self, trial: str, seen: Untruths) -> None:
        self.leaked += [f"{trial}: {line}" for line in seen.leaked]
        self.lying += [f"{trial}: {line}" for line in seen.lying]
        self.unrecorded += [f"{trial}: {line}" for line in seen.unrecorded]

    def record(self, where: str, seed: int, began: float) -> None:
        campaign.record(SECTION, f"leaked domains after restart ({where})", len(self.leaked), "0")
        campaign.record(SECTION, f"rows without their event ({where})", len(self.unrecorded),
                        "0")
        campaign.record(SECTION, f"running rows without a domain ({where})", len(self.lying),
                        "0")
        campaign.record(SECTION, f"cut closes unfinished after restart ({where})",
                        len(self.unfinished), "0")
        campaign.record(SECTION, f"cut VM destroys not ended destroyed after restart ({where})",
                        len(self.destroys_not_destroyed), "0")
        campaign.record(SECTION, f"runtime, {where} (s, seed {seed})",
                        time.monotonic() - began)

    def assert_clean(self) -> None:
        assert not self.leaked, f"leaked domains: {self.leaked}"
        assert not self.unrecorded, f"rows without their event: {self.unrecorded}"
        assert not self.lying, f"running rows without a domain: {self.lying}"
        assert not self.unfinished, f"cut closes unfinished after restart: {self.unfinished}"
        assert not self.destroys_not_destroyed, \
            f"cut VM destroys not ended destroyed: {self.destroys_not_destroyed}"

    def destroys_ended(self, trial: str, srv: Server, vm_ids: set[str]) -> None:
        """Each VM whose destroy the kill cut (its row `running`, its domain gone or shut
        off) ended `destroyed` with one `vm_destroyed` and no `vm_failed`: Rift asked
        for the destroy, so nothing outside it is blamed."""
        ended = vm_rows(srv)
        for vm_id in sorted(vm_ids):
            vm = ended[vm_id]
            told = [kind for kind, _, details in events(srv, vm["task_id"])
                    if details.get("vm_id") == vm_id]
            if (vm["status"] != "destroyed" or told.count("vm_destroyed") != 1
                    or "vm_failed" in told):
                self.destroys_not_destroyed.append(
                    f"{trial}: {vm_id} ended {vm['status']} ({vm['error']}): {told}")


def cut_work(srv: Server, creating_before: set[str], tally: Tally) -> Counter[str]:
    """What the store and the host show half done right after a kill: creates
    (`creating` rows made in this trial), destroys (a `running` row whose domain is
    gone or shut off), closes and idle closes (closed tasks with live VMs)."""
    found: Counter[str] = Counter()
    cut = {r["id"] for r in creating(srv)} - creating_before
    tally.creates_cut |= cut
    found["vm_new"] = len(cut)
    running = {r["id"] for r in rows(srv, "SELECT id FROM vms WHERE status = 'running'")}
    domains = our_domains(srv, SHARED_URI)
    destroys = {vm_id for vm_id in running if vm_id not in domains or not domains[vm_id].active}
    tally.destroys_cut |= destroys
    found["vm_destroy"] = len(destroys)
    for r in rows(srv, "SELECT t.close_reason AS reason, count(DISTINCT t.id) AS n FROM tasks t "
                  "JOIN vms v ON v.task_id = t.id WHERE t.status = 'closed' AND v.status IN "
                  "('creating', 'running') GROUP BY t.close_reason"):
        found["sweep" if r["reason"] == "idle" else "task_close"] += int(r["n"])
    return found


def closed_tasks(srv: Server) -> set[str]:
    return {r["id"] for r in rows(srv, "SELECT id FROM tasks WHERE status = 'closed'")}


def creating(srv: Server) -> list[sqlite3.Row]:
    return rows(srv, "SELECT id FROM vms WHERE status = 'creating'")


def idle_close_under_way(srv: Server) -> bool:
    """The sweep closed a quiet task and is destroying its VMs."""
    return bool(rows(srv, "SELECT 1 FROM tasks t JOIN vms v ON v.task_id = t.id "
                     "WHERE t.status = 'closed' AND t.close_reason = 'idle' "
                     "AND v.status IN ('creating', 'running') LIMIT 1"))


@contextmanager
def shared_host_kept() -> Iterator[None]:
    """Keep a connection to the shared test host open meanwhile: libvirtd frees the
    test driver's `default` state (every domain on it) when its last client hangs
    up, so without this a killed server, if it was the only client, would take its
    domains with it and no crash could leak one."""
    from hypervisor.libvirt import LibvirtHypervisor

    keeper = LibvirtHypervisor(SHARED_URI)
    try:
        keeper.info()  # opens the connection
        yield
    finally:
        keeper.close()


def put_away(srv: Server, uri: str) -> None:
    """Whatever a failed test left of this installation on `uri`."""
    from hypervisor.libvirt import LibvirtHypervisor

    hv = LibvirtHypervisor(uri)
    try:
        for domain in our_domains(srv, uri).values():
            hv.destroy(domain.name)
    finally:
        hv.close()


# -- the test-driver campaign: agents over both doors --------------------------------------

class Refused(Exception):
    """A refusal an agent expects in this workload (its task closed meanwhile)."""


EXPECTED_REFUSALS = {"task_closed"}  # the sweep closed a quiet task under its agent


class Door(Protocol):
    async def task_new(self, name: str) -> tuple[str, str]: ...
    async def vm_new(self, task_id: str, handle: str) -> dict[str, Any]: ...
    async def vm_destroy(self, task_id: str, handle: str, vm_id: str) -> None: ...
    async def task_close(self, task_id: str, handle: str) -> None: ...
    async def task_attach(self, task_id: str) -> str: ...
    async def task_release(self, task_id: str, handle: str) -> None: ...


class Rest:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def _ask(self, method: str, path: str, handle: str | None = None,
                   body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Rift-Handle": handle} if handle else {}
        answer = await self.http.request(method, path, headers=headers, json=body)
        if answer.status_code >= 400:
            error = answer.json().get("error", {}) if answer.content else {}
            if error.get("code") in EXPECTED_REFUSALS:
                raise Refused(error["code"])
            raise AssertionError(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
        found: dict[str, Any] = answer.json()
        return found

    async def task_new(self, name: str) -> tuple[str, str]:
        opened = await self._ask("POST", "/tasks", body={"name": name})
        return opened["task"]["id"], opened["handle"]

    async def vm_new(self, task_id: str, handle: str) -> dict[str, Any]:
        made = await self._ask("POST", f"/tasks/{task_id}/vms", handle, {"memory_mib": 64})
        vm: dict[str, Any] = made["vm"]
        return vm

    async def vm_destroy(self, task_id: str, handle: str, vm_id: str) -> None:
        await self._ask("DELETE", f"/vms/{vm_id}", handle)

    async def task_close(self, task_id: str, handle: str) -> None:
        await self._ask("POST", f"/tasks/{task_id}/close", handle)

    async def task_attach(self, task_id: str) -> str:
        attached = await self._ask("POST", f"/tasks/{task_id}/attach", body={"takeover": True})
        return str(attached["handle"])

    async def task_release(self, task_id: str, handle: str) -> None:
        await self._ask("POST", f"/tasks/{task_id}/release", handle)


class Mcp:
    def __init__(self, session: Any) -> None:
        self.session = session

    async def _ask(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.session.call_tool(tool, args)
        content = result.structured_content
        assert isinstance(content, dict), result.content
        if result.is_error:
            if content["error"]["code"] in EXPECTED_REFUSALS:
                raise Refused(content["error"]["code"])
            raise AssertionError(f"{tool}: {content['error']}")
        return content

    async def task_new(self, name: str) -> tuple[str, str]:
        opened = await self._ask("rift_task_new", name=name)
        return opened["task"]["id"], opened["handle"]

    async def vm_new(self, task_id: str, handle: str) -> dict[str, Any]:
        vm: dict[str, Any] = (await self._ask("rift_vm_new", handle=handle, memory_mib=64))["vm"]
        return vm

    async def vm_destroy(self, task_id: str, handle: str, vm_id: str) -> None:
        await self._ask("rift_vm_destroy", handle=handle, vm_id=vm_id)

    async def task_close(self, task_id: str, handle: str) -> None:
        await self._ask("rift_task_close", handle=handle)

    async def task_attach(self, task_id: str) -> str:
        return str((await self._ask("rift_task_attach", task_id=task_id, takeover=True))["handle"])

    async def task_release(self, task_id: str, handle: str) -> None:
        await self._ask("rift_task_release", handle=handle)


class Agents:
    """One trial's workload: `AGENTS` agents, each in its own thread and event loop,
    round after round: open a task, make one to three VMs, sometimes release it and
    attach it again or take it over, then destroy one VM and close the task, or
    close it, or leave it quiet for the sweep to close. Counts the calls of each
    kind in flight (what a kill cuts); a failure before the kill is the workload's
    own and fails the test."""

    def __init__(self, srv: Server, seed: int) -> None:
        self.srv = srv
        self.seed = seed
        self.lock = threading.Lock()
        self.flying: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()
        self.stop = threading.Event()
        self.killing = threading.Event()
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._agent, args=(n,), daemon=True)
                        for n in range(AGENTS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def in_flight(self) -> Counter[str]:
        with self.lock:
            return +self.flying

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(JOIN_S)
        hanging = sum(thread.is_alive() for thread in self.threads)
        assert not hanging, f"{hanging} agents hang after the crash"

    @contextmanager
    def flight(self, kind: str) -> Iterator[None]:
        with self.lock:
            self.flying[kind] += 1
        try:
            yield
        finally:
            with self.lock:
                self.flying[kind] -= 1
        with self.lock:
            self.answered[kind] += 1

    def _agent(self, n: int) -> None:
        rng = random.Random(self.seed * AGENTS + n)
        try:
            anyio.run(self._by_mcp if n == AGENTS - 1 else self._by_rest, n, rng)
        except BaseException as exc:  # a cut call is the point once the kill has come
            if not self.killing.is_set():
                self.failures.append(f"agent {n}: {exc!r}")

    async def _by_rest(self, n: int, rng: random.Random) -> None:
        async with httpx.AsyncClient(base_url=self.srv.url + "/api/v1", timeout=JOIN_S,
                                     headers={"Authorization": f"Bearer {self.srv.token}"}
                                     ) as http:
            await self._rounds(Rest(http), n, rng)

    async def _by_mcp(self, n: int, rng: random.Random) -> None:
        async with mcp_session(self.srv.url, self.srv.token, f"crash-agent-{n}") as session:
            await self._rounds(Mcp(session), n, rng)

    async def _rounds(self, door: Door, n: int, rng: random.Random) -> None:
        while not self.stop.is_set():
            try:
                await self._round(door, n, rng)
            except Refused:
                continue

    async def _round(self, door: Door, n: int, rng: random.Random) -> None:
        with self.flight("task_new"):
            task_id, handle = await door.task_new(f"agent {n}")
        campaign.handle_secret(handle)
        made: list[str] = []
        for _ in range(rng.randint(1, 3)):
            with self.flight("vm_new"):
                vm = await door.vm_new(task_id, handle)
            # `destroyed`: the sweep closed the task while the VM was made.
            assert vm["status"] in ("running", "destroyed"), vm
            made.append(vm["id"])
        if rng.random() < 0.15:  # let go, and take it up again
            with self.flight("task_release"):
                await door.task_release(task_id, handle)
            handle = await self._attach(door, task_id)
        if rng.random() < 0.25:  # another conversation takes it over
            handle = await self._attach(door, task_id)
        roll = rng.random()
        if roll < 0.4:
            with self.flight("vm_destroy"):
                await door.vm_destroy(task_id, handle, rng.choice(made))
        if roll < 0.75:
            with self.flight("task_close"):
                await door.task_close(task_id, handle)
        # else the task stays open and quiet: the sweep closes it, and destroys its VMs

    async def _attach(self, door: Door, task_id: str) -> str:
        with self.flight("task_attach"):
            handle = await door.task_attach(task_id)
        campaign.handle_secret(handle)
        return handle


def kill_in_start_up(srv: Server, pending: set[str], rng: random.Random) -> bool:
    """Start the server again and kill it once its start-up pass (the sweep it runs
    before taking calls) has put away one of the VMs of the closes the first kill
    cut, so the pass itself is cut half-way. Answers whether that moment came."""
    proc, _url = launch(srv.env, srv.log, admin_lines=False)
    marks = ",".join("?" * len(pending))

    def progressed() -> bool:
        return bool(rows(srv, f"SELECT 1 FROM vms WHERE id IN ({marks}) AND status NOT IN "
                         "('creating', 'running') LIMIT 1", *sorted(pending)))

    deadline = time.monotonic() + 60
    while proc.poll() is None and not progressed() and time.monotonic() < deadline:
        time.sleep(0.001)
    seen = progressed()
    time.sleep(rng.uniform(0, 0.005))
    assert proc.poll() is None, f"rift serve exited by itself: {srv.log.read_text()[-2000:]}"
    kill_server(proc)
    return seen


def aim(srv: Server, agents: Agents, kind: str, rng: random.Random) -> bool:
    """Wait a random time, then until work of `kind` is under way (a call of it in
    flight; for the sweep, an idle close destroying VMs), then a few random
    milliseconds more. Answers whether it was seen (else the kill comes anyway)."""
    time.sleep(rng.uniform(0.1, 0.6))
    seen: Callable[[], bool] = ((lambda: idle_close_under_way(srv)) if kind == "sweep"
                                else (lambda: agents.in_flight()[kind] > 0))
    deadline = time.monotonic() + AIM_S
    while not seen() and time.monotonic() < deadline and not agents.failures:
        time.sleep(0.001)
    found = seen()
    time.sleep(rng.uniform(0, 0.03))
    return found


def one_test_driver_trial(proc: subprocess.Popen[str], srv: Server, trial: int, seed: int,
                          tally: Tally, kind: str) -> tuple[subprocess.Popen[str], Server]:
    """One kill -9 aimed at `kind` during the agents' work, a restart, and the
    promise checked."""
    rng = random.Random(f"{seed}:{trial}")
    before = {r["id"] for r in creating(srv)}
    agents = Agents(srv, rng.randrange(2**32))
    agents.start()
    try:
        aimed = aim(srv, agents, kind, rng)
        agents.killing.set()
        flying = agents.in_flight()
        kill_server(proc)
    finally:
        agents.finish()
    assert not agents.failures, f"trial {trial} (seed {seed}): {agents.failures}"
    assert sum(agents.answered.values()) > 0, "the agents got no answer before the kill"
    tally.trials += 1
    tally.aimed[kind] += aimed
    tally.kills_in_flight += any(flying[k] for k in KINDS)
    for name in flying:
        tally.in_flight[name] += 1
    destroys_before = set(tally.destroys_cut)
    cut = cut_work(srv, before, tally)
    destroys_cut = tally.destroys_cut - destroys_before
    tally.kills_cutting += any(cut.values())
    for name, n in cut.items():
        tally.cut[name] += n > 0
    closed = closed_tasks(srv)
    pending = {vm_id for vm_id, vm in vm_rows(srv).items()
               if vm["task_id"] in closed and vm["status"] in LIVE}
    if len(pending) >= 2 and rng.random() < 0.5:  # and again in the start-up pass
        tally.start_up_kills += kill_in_start_up(srv, pending, rng)
        closed = closed_tasks(srv)
    proc, srv = restart_server(srv)
    name = f"trial {trial} ({SHOWN[kind]})"
    tally.found(name, untruths(srv, SHARED_URI))
    # The start-up pass finishes every close the kill cut before the first call.
    tally.unfinished += [f"{name}: {vm_id}" for vm_id, vm in vm_rows(srv).items()
                         if vm["task_id"] in closed and vm["status"] in LIVE]
    # And every destroy it cut, as a destroy (never `failed`).
    tally.destroys_ended(name, srv, destroys_cut)
    return proc, srv


def settle(srv: Server, tally: Tally) -> None:
    """After the last trial: every quiet task closes, every interrupted create turns
    `failed` once older than the grace; then no domain of the installation is left."""
    cleared = srv.rift("pool", "clear", POOL_IMAGE)
    assert cleared.returncode == 0, cleared.stderr

    def done() -> bool:
        return not rows(srv, "SELECT 1 FROM tasks WHERE status = 'open' LIMIT 1") and \
            not rows(srv, "SELECT 1 FROM vms WHERE status IN ('creating', 'running') LIMIT 1") \
            and not rows(srv, "SELECT 1 FROM pool_vms LIMIT 1")

    wait_until(done, GRACE_S + 20, "every task closed and every VM put away", every_s=0.2)
    tally.found("after the last trial", untruths(srv, SHARED_URI))
    tally.leaked += [f"after the last trial: {domain.name}"
                     for domain in our_domains(srv, SHARED_URI).values()]
    ends = Counter(vm["status"] for vm_id, vm in vm_rows(srv).items()
                   if vm_id in tally.creates_cut)
    starts = Counter(vm["start_kind"] for vm in vm_rows(srv).values())
    campaign.record(SECTION, "test-driver VMs started from a pool, restored, booted (kills "
                    "landed amid refills and hand-outs)",
                    f"{starts['pool']}, {starts['restore']}, {starts['boot']}")
    campaign.record(SECTION, "test-driver creates cut by a kill: then failed (the grace) "
                    f"{ends['failed']}, destroyed (their task closed) {ends['destroyed']}",
                    len(tally.creates_cut))


@pytest.mark.timeout(campaign.scale(300, 1200))
def test_kill_9_at_random_moments_on_the_test_driver(tmp_path: Path) -> None:
    missing = shared_host_missing()
    if missing:
        pytest.skip(missing)
    seed = campaign_seed()
    began = time.monotonic()
    tally = Tally()
    with shared_host_kept():
        proc, srv = start_server(tmp_path, **TEST_DRIVER_ENV)
        first = srv
        # The agents' VMs (64 MiB of the default image) come from pools while they last,
        # so kills land amid refills and hand-outs too.
        pooled = srv.rift("pool", "set", POOL_IMAGE, "--running", "3", "--saved", "1",
                          "--memory-mib", "64")
        assert pooled.returncode == 0, pooled.stderr
        campaign.enlist(srv.data_dir, srv.log, srv.token, srv.password)
        try:
            for trial in range(TEST_DRIVER_TRIALS):
                proc, srv = one_test_driver_trial(proc, srv, trial, seed, tally,
                                                  KINDS[trial % len(KINDS)])
            for trial in range(TEST_DRIVER_TRIALS, TEST_DRIVER_TRIALS + EXTRA_TRIALS):
                uncut = [kind for kind in MUST_CUT if not tally.cut[kind]]
                if not uncut:
                    break
                proc, srv = one_test_driver_trial(proc, srv, trial, seed, tally, uncut[0])
            settle(srv, tally)
        finally:
            stop_server(proc)
            put_away(first, SHARED_URI)
    campaign.record(SECTION, "kill -9 trials on the test driver, each restarted (aimed at: "
                    + ", ".join(f"{SHOWN[k]} {tally.aimed[k]}" for k in KINDS) + ")",
                    tally.trials, "≥ 50 (soak)")
    campaign.record(SECTION, "test-driver kills with calls in flight (of "
                    + ", ".join(f"{SHOWN[k]} {tally.in_flight[k]}" for k in KINDS[:3]) + ")",
                    tally.kills_in_flight)
    campaign.record(SECTION, "test-driver kills that left work half done ("
                    + ", ".join(f"{SHOWN[k]} {tally.cut[k]}" for k in KINDS) + ")",
                    tally.kills_cutting)
    campaign.record(SECTION, "test-driver second kills cutting a restart's start-up pass",
                    tally.start_up_kills)
    tally.record("test driver", seed, began)
    assert TEST_DRIVER_TRIALS <= tally.trials <= TEST_DRIVER_TRIALS + EXTRA_TRIALS
    tally.assert_clean()
    for kind in KINDS:  # every kind of work was cut by some kill
        assert tally.aimed[kind] > 0, (kind, tally)
    assert all(tally.cut[kind] for kind in MUST_CUT), tally
    assert tally.in_flight["vm_destroy"], tally


# -- real guests --------------------------------------------------------------------------

def in_thread(scenario: Callable[[], Awaitable[None]]
              ) -> tuple[threading.Thread, list[BaseException]]:
    """Run an async scenario in its own thread and event loop (a call that a
    `kill -9` will cut); answers the thread and where its exception lands."""
    failures: list[BaseException] = []

    def body() -> None:
        try:
            anyio.run(scenario)
        except BaseException as exc:  # what a cut call raises is the point
            failures.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, failures


def join_cut(thread: threading.Thread) -> None:
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the call in flight hangs after the crash"


@dataclass
class Home:
    """The real-guest campaign's one data dir, its server of the moment, and the tally."""

    tmp: Path
    rng: random.Random
    tally: Tally
    proc: subprocess.Popen[str] | None = None
    srv: Server | None = None
    closed_at_kill: set[str] = field(default_factory=set)

    def up(self, **env: str) -> Server:
        """A server (the first start, or again on the same data dir) with `env`."""
        assert self.proc is None
        if self.srv is None:
            self.proc, self.srv = start_real_server(self.tmp, **{**REAL_ENV, **env})
            campaign.enlist(self.srv.data_dir, self.srv.log, self.srv.token, self.srv.password)
        else:
            self.proc, self.srv = restart_server(self.srv, **{**REAL_ENV, **env})
        return self.srv

    def kill(self) -> None:
        assert self.proc is not None and self.srv is not None
        kill_server(self.proc)
        self.proc = None
        self.closed_at_kill = closed_tasks(self.srv)

    def recover(self, trial: str) -> Server:
        """Restart after the kill (short grace, sweeps every second); the promise is
        checked at once: the start-up reconciliation ran before /healthz answered."""
        srv = self.up(**RECOVER_ENV)
        self.tally.found(trial, untruths(srv, REAL_URI))
        self.tally.unfinished += [f"{trial}: {vm_id}" for vm_id, vm in vm_rows(srv).items()
                                  if vm["task_id"] in self.closed_at_kill
                                  and vm["status"] in LIVE]
        return srv

    def down(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None


async def new_task(url: str, token: str, agent: str, name: str, vms: int,
                   task: dict[str, Any]) -> None:
    """A task with `vms` guests booted at once, each answering a command."""
    async with mcp_session(url, token, agent) as s:
        opened = await call(s, "rift_task_new", name=name)
        handle = opened["handle"]
        campaign.handle_secret(handle)
        task.update(id=opened["task"]["id"], handle=handle)
        made: list[dict[str, Any]] = []

        async def one(n: int) -> None:
            made.append((await call(s, "rift_vm_new", handle=handle, name=f"g{n}",
                                    image="tiny"))["vm"])

        async with anyio.create_task_group() as tg:
            for n in range(vms):
                tg.start_soon(one, n)
        for vm in made:
            assert vm["status"] == "running", vm
            ran = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"], command="true")
            assert ran["exit_code"] == 0
        task["vms"] = sorted(vm["id"] for vm in made)


def closed_for_good(srv: Server, task: dict[str, Any], reason: str,
                    live_at_kill: list[str]) -> None:
    """A close the kill cut: the restart's start-up pass finished it before the
    first call (nothing waits for a scheduled sweep): every VM destroyed, the ones
    left live by the kill by the sweep, one `closed` event."""
    assert not set(task["vms"]) & set(our_domains(srv))
    final = vm_rows(srv, task["id"])
    assert {vm_id: vm["status"] for vm_id, vm in final.items()} == \
        dict.fromkeys(task["vms"], "destroyed")
    told = events(srv, task["id"])
    closes = [details for kind, _, details in told if kind == "closed"]
    assert len(closes) == 1 and closes[0]["reason"] == reason, closes
    destroyed_by = {d["vm_id"]: actor for k, actor, d in told if k == "vm_destroyed"}
    assert set(destroyed_by) == set(task["vms"])
    assert {destroyed_by[vm_id] for vm_id in live_at_kill} <= {"sweep"}


def real_vm_new(home: Home, trial: str) -> bool:
    """The kill comes while the new guest boots (its row `creating`). While Rift is
    down a domain of its installation is made behind its back: the restart's
    reconciliation destroys it before the first call; the booting VM's row turns
    `failed` once older than the grace, its domain destroyed."""
    srv = home.up()
    stray = foreign_domain(srv.data_dir / "images", home.tmp, install_id(srv), new_vm_id())
    task: dict[str, str] = {}

    async def create() -> None:
        async with mcp_session(srv.url, srv.token, "doomed") as s:
            opened = await call(s, "rift_task_new", name="crash in vm_new")
            campaign.handle_secret(opened["handle"])
            task.update(id=opened["task"]["id"], handle=opened["handle"])
            await s.call_tool("rift_vm_new", {"handle": opened["handle"], "image": "tiny"})

    thread, failures = in_thread(create)
    vm_id = wait_until(lambda: next(iter(vm_rows(srv, task.get("id", "-"))), None),
                       30, "the VM row exists", every_s=0.02)
    time.sleep(home.rng.uniform(0, 2.0))  # the guest boots in about 3.5 s
    home.kill()
    join_cut(thread)
    at_kill = vm_rows(srv)[vm_id]["status"]
    campaign.harvest_keys(srv.data_dir)
    cut: bool = at_kill == "creating"
    assert failures or not cut, "rift_vm_new answered although its server was killed"
    define_and_start(stray, home.tmp)
    try:
        srv = home.recover(trial)
        assert stray.name not in {d.name for d in our_domains(srv).values()}
    finally:
        remove_domain(stray.name)
    wait_until(lambda: vm_rows(srv)[vm_id]["status"] not in LIVE if cut else True, 30,
               "the interrupted create turns failed")
    vm = vm_rows(srv)[vm_id]
    told = [(k, actor) for k, actor, _ in events(srv, task["id"])]
    if cut:
        assert vm["status"] == "failed" and "interrupted" in vm["error"], dict(vm)
        assert vm_id not in our_domains(srv)
        assert told == [("opened", "mcp:doomed"), ("vm_creating", "mcp:doomed"),
                        ("vm_failed", "sweep")], told
    else:
        assert vm["status"] == "running" and our_domains(srv)[vm_id].active, dict(vm)
    home.tally.found(f"{trial}, settled", untruths(srv, REAL_URI))

    async def still_usable() -> None:
        async with mcp_session(srv.url, srv.token, "doomed") as s:
            got = await call(s, "rift_task_get", handle=task["handle"])
            assert got["task"]["status"] == "open"
            assert [v["status"] for v in got["task"]["vms"]] == [vm["status"]]
            await call(s, "rift_task_close", handle=task["handle"])

    run(still_usable, LIMIT_S)
    return cut


def real_task_close(home: Home, trial: str) -> bool:
    """The kill comes once the close is committed, while its guests are destroyed
    (one may be left shut off but defined: libvirt finished the destroy its dead
    client asked for); the restart destroys the rest before it takes a call."""
    srv = home.up()
    task: dict[str, Any] = {}
    run(lambda: new_task(srv.url, srv.token, "closer", "crash in close", 2, task), LIMIT_S)
    campaign.harvest_keys(srv.data_dir)

    async def close() -> None:
        async with mcp_session(srv.url, srv.token, "closer") as s:
            await s.call_tool("rift_task_close", {"handle": task["handle"]})

    thread, failures = in_thread(close)
    wait_until(lambda: rows(srv, "SELECT status FROM tasks WHERE id = ?",
                            task["id"])[0]["status"] == "closed",
               30, "the close is committed", every_s=0.002)
    time.sleep(home.rng.uniform(0, 0.05))
    home.kill()
    live = [vm_id for vm_id, vm in vm_rows(srv, task["id"]).items() if vm["status"] in LIVE]
    join_cut(thread)
    assert failures or not live, "rift_task_close answered although its server was killed"
    srv = home.recover(trial)
    closed_for_good(srv, task, "closed", live)
    return bool(live)


def real_sweep(home: Home, trial: str) -> bool:
    """The task falls quiet and the sweep closes it: the kill comes while the sweep
    destroys its guests; the restart finishes the idle close."""
    srv = home.up(RIFT_TASK_IDLE_S=str(IDLE_S))
    task: dict[str, Any] = {}
    run(lambda: new_task(srv.url, srv.token, "quiet", "crash in the sweep", 2, task), LIMIT_S)
    campaign.harvest_keys(srv.data_dir)
    wait_until(lambda: rows(srv, "SELECT status FROM tasks WHERE id = ?",
                            task["id"])[0]["status"] == "closed",
               IDLE_S + 30, "the sweep closes the quiet task", every_s=0.002)
    time.sleep(home.rng.uniform(0, 0.05))
    home.kill()
    live = [vm_id for vm_id, vm in vm_rows(srv, task["id"]).items() if vm["status"] in LIVE]
    srv = home.recover(trial)
    closed_for_good(srv, task, "idle", live)
    return bool(live)


def real_vm_destroy(home: Home, trial: str) -> bool:
    """The kill comes while one of two guests is destroyed: after the restart that
    VM is `destroyed` (the restart finishes the destroy asked for, with its one
    `vm_destroyed`; never `failed`) and its domain is gone, and the other guest
    (which outlived its control plane) still answers commands."""
    srv = home.up()
    task: dict[str, Any] = {}
    run(lambda: new_task(srv.url, srv.token, "destroyer", "crash in destroy", 2, task),
        LIMIT_S)
    campaign.harvest_keys(srv.data_dir)
    doomed, kept = task["vms"]

    sent = threading.Event()

    async def destroy() -> None:
        async with mcp_session(srv.url, srv.token, "destroyer") as s:
            sent.set()
            await s.call_tool("rift_vm_destroy", {"handle": task["handle"], "vm_id": doomed})

    thread, failures = in_thread(destroy)
    assert sent.wait(30), "the destroy was never sent"
    # Rift records the request on the row before it asks libvirt; a kill before that
    # would cut nothing (the VM runs on), so the kill comes after it.
    wait_until(lambda: rows(srv, "SELECT destroy_requested_at AS asked FROM vms WHERE id = ?",
                            doomed)[0]["asked"] is not None,
               30, "the destroy is asked for", every_s=0.002)
    time.sleep(home.rng.uniform(0, 0.15))  # a guest's destroy takes a few tenths
    home.kill()
    join_cut(thread)
    at_kill = vm_rows(srv)[doomed]["status"]
    srv = home.recover(trial)
    after = vm_rows(srv)
    # The destroy was asked for: the restart finishes it as one, never `failed`.
    assert after[doomed]["status"] == "destroyed", dict(after[doomed])
    home.tally.destroys_ended(trial, srv, {doomed})
    assert doomed not in our_domains(srv)
    assert after[kept]["status"] == "running"

    async def the_other_lives() -> None:
        async with mcp_session(srv.url, srv.token, "destroyer") as s:
            ran = await call(s, "rift_vm_exec", handle=task["handle"], vm_id=kept,
                             command="echo alive")
            assert ran["stdout"].strip() == "alive"
            closed = await call(s, "rift_task_close", handle=task["handle"])
            assert closed["destroyed"] == [kept]

    run(the_other_lives, LIMIT_S)
    return at_kill in LIVE and bool(failures)


REAL_SCENARIOS: dict[str, Callable[[Home, str], bool]] = {
    "vm_new": real_vm_new, "task_close": real_task_close, "vm_destroy": real_vm_destroy,
    "sweep": real_sweep}


@pytest.mark.slow
@pytest.mark.timeout(campaign.scale(300, 900))
@pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or "")
def test_kill_9_at_random_moments_with_real_guests(tmp_path: Path) -> None:
    seed = campaign_seed()
    began = time.monotonic()
    home = Home(tmp_path, random.Random(seed), Tally())
    try:
        for trial in range(REAL_TRIALS):
            kind = REAL_KINDS[trial % len(REAL_KINDS)]
            cut = REAL_SCENARIOS[kind](home, f"real trial {trial} ({SHOWN[kind]})")
            home.tally.trials += 1
            home.tally.cut[kind] += cut
            assert home.srv is not None
            assert not our_domains(home.srv), "the trial's guests outlived their task"
            # Its task closed: no private key and no serial log of its guests is left.
            left = [f"{d}/{f.name}" for d in ("keys", "serial")
                    for f in (home.srv.data_dir / d).iterdir()]
            assert not left, f"{kind}: left behind {left}"
            home.down()
    finally:
        home.down()
        if home.srv is not None:
            put_away(home.srv, REAL_URI)
    campaign.record(SECTION, "kill -9 trials with real guests, each restarted",
                    home.tally.trials, "≥ 5 (soak)")
    campaign.record(SECTION, "real-guest kills that cut the work: "
                    + ", ".join(f"{SHOWN[k]} {home.tally.cut[k]}"
                                for k in REAL_KINDS[:REAL_TRIALS]),
                    sum(home.tally.cut.values()))
    home.tally.record("real guests", seed, began)
    home.tally.assert_clean()
    assert home.tally.trials == REAL_TRIALS
