"""Rules every repository checks: which fields a change may touch, limits, times.
(Tasks, VMs, pooled VMs and snapshots change by their domain transitions, saved
whole by their repository's `save`: see `changed`.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

HOST_CHANGEABLE = frozenset({"uri", "vcpus", "memory_mib", "drained", "unreachable_since",
                             "last_error"})
POOL_CHANGEABLE = frozenset({"running", "saved", "failures", "retry_at", "last_error",
                             "filler", "fill_until"})
EXEC_END_CHANGEABLE = frozenset({"status", "ended_at", "exit_code", "signal", "timed_out",
                                 "stdout_bytes", "stderr_bytes", "duration_ms"})
EXEC_END_STATUSES = frozenset({"exited", "killed", "timed_out", "lost"})
TASK_LIST_STATUSES = frozenset({"open", "closed", "all"})


def check_changes(kind: str, changes: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Refuse fields that are not there or may not change (ids, owners, ``lease_gen``)."""
    bad = sorted(set(changes) - allowed)
    if bad:
        raise ValueError(f"{kind} fields that cannot be changed: {', '.join(bad)}")


def changed(new: Any, was: Any) -> dict[str, Any]:
    """The fields a domain transition changed: what `save` writes (nothing else, so
    a column another writer moved meanwhile is not put back). Refuses a change of
    the object's id: a transition answers the same object."""
    if new.id != was.id:
        raise ValueError(f"a saved object keeps its id: {was.id!r}, not {new.id!r}")
    return {f.name: getattr(new, f.name) for f in dataclasses.fields(new)
            if getattr(new, f.name) != getattr(was, f.name)}


def check_limit(limit: int) -> None:
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")


def check_list_status(status: str) -> None:
    if status not in TASK_LIST_STATUSES:
        raise ValueError(f"status must be one of open, closed, all; got {status!r}")


def utc(at: datetime) -> datetime:
    """The store keeps only timezone-aware times, in UTC."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"the store needs timezone-aware datetimes, got naive {at!r}")
    return at.astimezone(UTC)
