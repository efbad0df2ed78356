"""Rules every repository checks: what a transition changed, limits, times.
(Tasks, VMs, execs, hosts, pools, pooled VMs and snapshots change by their domain
transitions, saved by their repository's `save`: see `changed`.)"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

TASK_LIST_STATUSES = frozenset({"open", "closed", "all"})


def changed(new: Any, was: Any, key: str = "id") -> dict[str, Any]:
    """The fields a domain transition changed: what `save` writes (nothing else, so
    a column another writer moved meanwhile is not put back). Refuses a change of
    the object's ``key`` (its id): a transition answers the same object."""
    if getattr(new, key) != getattr(was, key):
        raise ValueError(f"a saved object keeps its {key}: {getattr(was, key)!r}, "
                         f"not {getattr(new, key)!r}")
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
