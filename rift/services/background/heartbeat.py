"""Quiet time does not accrue while Rift itself is down.

Every sweep writes a heartbeat. When a control plane starts and the last
heartbeat is older than three sweep intervals, every replica was down for that
gap: each open task's last activity moves later by the gap (compare-and-set on
the heartbeat, so with several replicas exactly one shifts), so no task closes,
and no lease turns quiet, for time in which no agent could have called.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rift.services.context import Deps

HEARTBEAT = "heartbeat_at"


def beat(deps: Deps) -> None:
    now = deps.clock.now().isoformat()
    with deps.store.write() as tx:
        tx.meta.swap(HEARTBEAT, tx.meta.get(HEARTBEAT), now)


def resume(deps: Deps, sweep_interval_s: int) -> float:
    """At start: answers the seconds of downtime the task clocks were moved by."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        last = tx.meta.get(HEARTBEAT)
        if last is None:
            tx.meta.swap(HEARTBEAT, None, now.isoformat())
            return 0.0
        gap = (now - datetime.fromisoformat(last)).total_seconds()
        if gap <= 3 * sweep_interval_s or not tx.meta.swap(HEARTBEAT, last, now.isoformat()):
            return 0.0
        moved = tx.tasks.shift_open(gap)
    deps.log.info("resumed after downtime", extra={
        "down_s": round(gap, 1), "tasks_shifted": moved,
        "down_since": (now - timedelta(seconds=gap)).isoformat()})
    return gap
