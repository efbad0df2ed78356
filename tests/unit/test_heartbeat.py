"""Downtime of the control plane is not quiet time."""

from __future__ import annotations

from datetime import datetime

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import heartbeat, sweeps
from rift.services.context import Deps
from rift.services.lifecycle import tasks
from tests.support.engine import ALICE


def test_a_restart_after_a_long_gap_moves_the_task_clocks_by_the_gap(
        deps: Deps, clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    sweeps.sweep(deps)  # a heartbeat
    clock.advance(3 * 3600)  # 3 hours up, quiet
    sweeps.sweep(deps)
    clock.advance(5 * 3600)  # then 5 hours down: no sweep, no call could be made
    assert heartbeat.resume(deps, sweep_interval_s=60) == 5 * 3600
    view = tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=opened.task.id)).task
    assert view.status == "open"
    before, after = (datetime.fromisoformat(v.replace("Z", "+00:00")) for v in (
        opened.task.closes_at, view.closes_at))
    assert (after - before).total_seconds() == 5 * 3600
    assert sweeps.sweep(deps).closed == []  # 3 h of real quiet: not yet 4
    clock.advance(3599)
    assert sweeps.sweep(deps).closed == []
    clock.advance(1)
    assert sweeps.sweep(deps).closed == [opened.task.id]  # 4 h of quiet while up


def test_a_short_gap_is_no_downtime_and_a_second_replica_does_not_shift_again(
        deps: Deps, clock: FakeClock) -> None:
    tasks.new(deps, ALICE, command(c.TaskNewIn))
    sweeps.sweep(deps)
    clock.advance(120)
    assert heartbeat.resume(deps, sweep_interval_s=60) == 0.0
    clock.advance(7200)
    assert heartbeat.resume(deps, sweep_interval_s=60) == 7320
    assert heartbeat.resume(deps, sweep_interval_s=60) == 0.0  # the first one already did


def test_a_first_start_records_a_heartbeat_and_shifts_nothing(deps: Deps) -> None:
    assert heartbeat.resume(deps, sweep_interval_s=60) == 0.0
    with deps.store.read() as tx:
        assert tx.meta.get(heartbeat.HEARTBEAT) is not None
