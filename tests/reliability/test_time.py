"""Time (issue 7): the 30-minute takeover and the 4-hour close are exact to the
step. Through the engine on a fake clock over each database (SQLite,
PostgreSQL), with timestamps carrying microseconds, and end to end on a real
`rift serve` whose clocks are seconds long.

"Exact to the step": a lease stays active until exactly `RIFT_LEASE_QUIET_S`
after its stored activity, and a task is not closed one clock step before
`closes_at` and is closed by the first sweep at or after it. The stored clock
itself moves once per `RIFT_ACTIVITY_STEP_S`, which is what `closes_at` says.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rift.catalog import StaticImages
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.domain.errors import TaskHeld
from rift.domain.leases import LeaseRules
from rift.services.background import sweeps
from rift.services.context import Caller, Deps, Limits
from rift.services.lifecycle import leases, tasks
from rift.services.operator.hosts import ensure_local_host
from rift.services.ports import Store
from tests.support import campaign
from tests.support.engine import FakePool
from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.servers import Server, start_server, stop_server

ALICE = Caller("alice", "mcp:first")
ALICE_2 = Caller("alice", "mcp:second")
STEP = timedelta(microseconds=1)  # the fake clock's step at the boundaries
QUIET_S, IDLE_S, ACTIVITY_S = 1800, 14400, 60


@pytest.fixture
def engine(store: Store) -> Iterator[tuple[Deps, FakeClock]]:
    # Microseconds in every timestamp: a store that rounded them would show here.
    clock = FakeClock(datetime(2026, 3, 1, 9, 30, 15, 123457, tzinfo=UTC))
    deps = Deps(store=store, clock=clock, hosts=FakePool(), images=StaticImages(["tiny"]),
                lease_rules=LeaseRules(ACTIVITY_S, QUIET_S, IDLE_S), limits=Limits())
    ensure_local_host(deps, "fake:///local")
    yield deps, clock


def stored(deps: Deps, task_id: str) -> Any:
    with deps.store.read() as tx:
        return tx.tasks.get(task_id)


def set_clock(clock: FakeClock, at: datetime) -> None:
    clock.advance((at - clock.now()).total_seconds())
    assert clock.now() == at


def test_takeover_needs_takeover_until_exactly_thirty_quiet_minutes(
        engine: tuple[Deps, FakeClock], store_kind: str) -> None:
    deps, clock = engine
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn, name="quiet"))
    task_id, start = opened.task.id, clock.now()
    # Calls within one activity step do not move the stored clock; one at the
    # step does: the quiet period counts from there.
    clock.advance(ACTIVITY_S - 1)
    tasks.get(deps, ALICE, command(c.TaskGetIn, handle=str(opened.handle)))
    assert stored(deps, task_id).last_activity_at == start
    clock.advance(1)
    tasks.get(deps, ALICE, command(c.TaskGetIn, handle=str(opened.handle)))
    touched = stored(deps, task_id).last_activity_at
    assert touched == start + timedelta(seconds=ACTIVITY_S)
    quiet_at = touched + timedelta(seconds=QUIET_S)
    set_clock(clock, quiet_at - STEP)
    with pytest.raises(TaskHeld) as held:
        leases.attach(deps, ALICE_2, command(c.TaskAttachIn, task_id=task_id))
    assert held.value.details["lease_quiet_at"].startswith(quiet_at.strftime("%Y-%m-%dT%H:%M:%S"))
    set_clock(clock, quiet_at)
    won = leases.attach(deps, ALICE_2, command(c.TaskAttachIn, task_id=task_id))
    assert won.previous_holder == "mcp:first"
    campaign.record("Time", f"takeover refused one µs before 30 min, free at it ({store_kind})",
                    "yes", "yes")


def test_a_task_closes_at_exactly_four_quiet_hours_by_the_first_sweep(
        engine: tuple[Deps, FakeClock], store_kind: str) -> None:
    deps, clock = engine
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn, name="idle"))
    task_id = opened.task.id
    clock.advance(ACTIVITY_S * 3 + 0.5)
    tasks.get(deps, ALICE, command(c.TaskGetIn, handle=str(opened.handle)))  # a touch
    closes_at = stored(deps, task_id).last_activity_at + timedelta(seconds=IDLE_S)
    view = tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=task_id)).task
    assert view.closes_at == closes_at.isoformat().replace("+00:00", "Z")
    set_clock(clock, closes_at - STEP)
    assert not sweeps.sweep(deps).closed
    assert stored(deps, task_id).is_open
    set_clock(clock, closes_at)
    assert sweeps.sweep(deps).closed == [task_id]
    closed = stored(deps, task_id)
    assert closed.close_reason == "idle" and closed.closed_at == closes_at
    assert not sweeps.sweep(deps).closed  # once
    told = tasks.events(deps, ALICE, command(c.TaskEventsIn, task_id=task_id)).events
    assert [e.type for e in told].count("closed") == 1
    campaign.record("Time", f"idle close: open one µs before 4 h, closed at it ({store_kind})",
                    "yes", "yes")


def test_with_sweeps_on_a_fixed_beat_each_task_closes_at_the_first_beat_after_due(
        engine: tuple[Deps, FakeClock], store_kind: str) -> None:
    """Tasks touched at random moments, sweeps every 60 s: each closes at the first
    sweep at or after its `closes_at`, never before, never a sweep late."""
    deps, clock = engine
    rng = random.Random(5)
    interval = timedelta(seconds=60)
    due: dict[str, datetime] = {}
    for n in range(12):
        opened = tasks.new(deps, ALICE, command(c.TaskNewIn, name=f"t{n}"))
        due[opened.task.id] = clock.now() + timedelta(seconds=IDLE_S)
        clock.advance(rng.uniform(0, 300))
    beat = clock.now()
    closed_at: dict[str, datetime] = {}
    while len(closed_at) < len(due):
        beat += interval
        set_clock(clock, beat)
        for task_id in sweeps.sweep(deps).closed:
            closed_at[task_id] = beat
    early = [t for t in due if closed_at[t] < due[t]]
    late = [t for t in due if closed_at[t] - due[t] >= interval]
    worst = max((closed_at[t] - due[t]).total_seconds() for t in due)
    campaign.record("Time", f"12 tasks, sweep every 60 s: closed early / a sweep late "
                    f"({store_kind})", f"{len(early)} / {len(late)} (latest {worst:.1f} s)",
                    "0 / 0 (< 60 s)")
    assert not early and not late, (early, late)


# -- end to end, seconds-long clocks ---------------------------------------------------

E2E_QUIET_S, E2E_IDLE_S, E2E_SWEEP_S = 2, 4, 1
SWEEP_SLACK_S = 1.0  # a sweep's own run time and scheduling on a busy machine


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(tmp_path_factory.mktemp("rift-time"),
                             RIFT_LEASE_QUIET_S=str(E2E_QUIET_S),
                             RIFT_TASK_IDLE_S=str(E2E_IDLE_S), RIFT_ACTIVITY_STEP_S="1",
                             RIFT_SWEEP_INTERVAL_S=str(E2E_SWEEP_S),
                             RIFT_VM_BOOT_TIMEOUT_S="5", RIFT_VM_CREATING_GRACE_S="6")
    campaign.enlist(srv.data_dir, srv.log, srv.token, srv.password)
    try:
        yield srv
    finally:
        stop_server(proc)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_end_to_end_takeover_is_refused_until_quiet_at_and_free_from_it(quick: Server) -> None:
    async def scenario() -> None:
        import anyio

        async with (mcp_session(quick.url, quick.token, "first") as first,
                    mcp_session(quick.url, quick.token, "second") as second):
            opened = await call(first, "rift_task_new", name="quiet e2e")
            campaign.handle_secret(opened["handle"])
            task_id = opened["task"]["id"]
            quiet_at = at(opened["task"]["lease_quiet_at"])
            held = await refused(second, "task_held", "rift_task_attach", task_id=task_id)
            assert at(held["lease_quiet_at"]) == quiet_at
            refusals = 1
            while datetime.now(UTC) < quiet_at - timedelta(milliseconds=150):
                result = await second.call_tool("rift_task_attach", {"task_id": task_id})
                now = datetime.now(UTC)
                if not result.is_error:  # won: only allowed at or after quiet_at
                    pytest.fail(f"attached {(quiet_at - now).total_seconds():.3f} s early")
                refusals += 1
                await anyio.sleep(0.1)
            await anyio.sleep(max(0.0, (quiet_at - datetime.now(UTC)).total_seconds()) + 0.01)
            won = await call(second, "rift_task_attach", task_id=task_id)
            campaign.handle_secret(won["handle"])
            assert won["previous_holder"] == "mcp:first"
            campaign.record("Time", "e2e takeover (quiet 2 s): refused before quiet_at, "
                            "free after", f"{refusals} refusals, then won", "won at quiet_at")
            await call(second, "rift_task_close", handle=won["handle"])

    run(scenario)


def test_end_to_end_idle_tasks_close_within_one_sweep_of_closes_at(quick: Server) -> None:
    """Tasks opened a moment apart: each reads `closes_at`; none closes before it,
    each closes by the first sweep after it."""
    lateness: list[float] = []

    async def scenario() -> None:
        import anyio

        async with mcp_session(quick.url, quick.token, "sleepy") as s:
            due: dict[str, datetime] = {}
            for n in range(8):
                opened = await call(s, "rift_task_new", name=f"idle {n}")
                campaign.handle_secret(opened["handle"])
                due[opened["task"]["id"]] = at(opened["task"]["closes_at"])
                await anyio.sleep(0.27)
            closed: dict[str, dict[str, Any]] = {}
            with anyio.fail_after(E2E_IDLE_S + 8 * 0.27 + 10):
                while len(closed) < len(due):
                    for task_id in set(due) - set(closed):
                        got = (await call(s, "rift_task_get", task_id=task_id))["task"]
                        if got["status"] == "closed":
                            closed[task_id] = got
                    await anyio.sleep(0.05)
            for task_id, task in closed.items():
                assert task["close_reason"] == "idle"
                assert at(task["closed_at"]) >= due[task_id], (task, due[task_id])
                lateness.append((at(task["closed_at"]) - due[task_id]).total_seconds())

    run(scenario, limit_s=60)
    campaign.record("Time", "e2e idle close (idle 4 s, sweep 1 s): earliest / latest after "
                    "closes_at", f"{min(lateness):.3f} s / {max(lateness):.3f} s",
                    f">= 0 / <= {E2E_SWEEP_S} s + slack")
    assert min(lateness) >= 0
    assert max(lateness) <= E2E_SWEEP_S + SWEEP_SLACK_S, lateness
