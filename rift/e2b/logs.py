"""A sandbox's logs (E2B's `GET /sandboxes/{id}/logs` and `GET /v2/sandboxes/{id}/logs`):
Rift's event log of the sandbox's task (SPEC §9: made, started, paused, slept and
woke, snapshotted, exposed, ended, each with its time, actor and details), one
entry an event. Blocking: the routes run these in worker threads.

- **v1** (`start`: Unix milliseconds, `limit`, at most 1,000): the events from
  `start` on, oldest first, as `logs` (`{timestamp, line}`) and `logEntries`
  (`{timestamp, message, level, fields}`).
- **v2** (`cursor`: Unix milliseconds, `limit`, `direction` `forward` or
  `backward`, `level` the least level shown, `search` a substring of the
  message): `logs` as entries; `forward` from the cursor on, oldest first;
  `backward` up to the cursor, newest first.

An event of a failure (`*_failed`) is level `error`, any other `info`. What the
guest itself prints (its console) is not a log here: it is the guest's own, read
through its files. A sandbox that has ended answers 404, as its detail does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rift.contract.tasks import TaskEventsIn
from rift.contract.views import EventView
from rift.domain.errors import InvalidArgument
from rift.e2b.sandboxes import Registry, live_vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle import tasks

MAX_LOGS = 1000  # E2B's own default and most per answer
MAX_EVENTS = 10_000  # the most of a task's events read for one answer
LEVELS = ("debug", "info", "warn", "error")
PAGE = 100


def _ms(at: str) -> int:
    return int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1000)


def _number(query: dict[str, str], key: str, default: int | None, most: int) -> int | None:
    text = query.get(key)
    if text is None or text == "":
        return default
    if not text.isdigit() or int(text) > most:
        raise InvalidArgument(key, f"a whole number from 0 to {most}")
    return int(text)


def _events(deps: Deps, caller: Caller, sandbox: str) -> list[EventView]:
    """The sandbox's task's events, oldest first (its VM must live)."""
    task_id = live_vm(deps, caller, sandbox).task_id
    found: list[EventView] = []
    after = 0
    while len(found) < MAX_EVENTS:
        page = tasks.events(deps, caller, TaskEventsIn(task_id=task_id, after_id=after,
                                                       limit=PAGE))
        found += page.events
        if not page.has_more:
            break
        after = page.next_after
    return found


def _entry(event: EventView) -> dict[str, Any]:
    details = " ".join(f"{k}={v}" for k, v in sorted(event.details.items())
                       if isinstance(v, str | int | float | bool))
    return {"timestamp": event.at,
            "message": f"{event.type} by {event.actor}" + (f": {details}" if details else ""),
            "level": "error" if event.type.endswith("_failed") else "info",
            "fields": {**event.details, "type": event.type, "actor": event.actor,
                       "event_id": event.id}}


def logs_v1(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
            query: dict[str, str]) -> dict[str, Any]:
    """`GET /sandboxes/{id}/logs`."""
    start = _number(query, "start", 0, 2**62)
    limit = _number(query, "limit", MAX_LOGS, MAX_LOGS)
    assert start is not None and limit is not None
    entries = [_entry(e) for e in _events(deps, caller, sandbox) if _ms(e.at) >= start][:limit]
    return {"logs": [{"timestamp": e["timestamp"], "line": e["message"]} for e in entries],
            "logEntries": entries}


def logs_v2(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
            query: dict[str, str]) -> dict[str, Any]:
    """`GET /v2/sandboxes/{id}/logs`."""
    cursor = _number(query, "cursor", None, 2**62)
    limit = _number(query, "limit", MAX_LOGS, MAX_LOGS)
    direction = query.get("direction") or "forward"
    if direction not in ("forward", "backward"):
        raise InvalidArgument("direction", "forward or backward")
    least = query.get("level") or "debug"
    if least not in LEVELS:
        raise InvalidArgument("level", " or ".join(LEVELS))
    search = query.get("search") or ""
    events = _events(deps, caller, sandbox)
    if direction == "backward":
        events = [e for e in reversed(events) if cursor is None or _ms(e.at) <= cursor]
    else:
        events = [e for e in events if cursor is None or _ms(e.at) >= cursor]
    entries = [entry for entry in map(_entry, events)
               if LEVELS.index(entry["level"]) >= LEVELS.index(least)
               and search in entry["message"]]
    return {"logs": entries[:limit]}
