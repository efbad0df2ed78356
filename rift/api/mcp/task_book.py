"""The task book: this replica's MCP tasks (SPEC §10), by id, and each task as
both eras show it (`tasks/get` of 2026-07-28, `Task` of 2025-11-25). The runtime
that runs them is `tasks.py`.

A task's record (at most `PER_USER` per user, kept `TTL_MS` from its creation)
lives in this replica's memory: with several replicas, a client's task calls must
reach the replica that made the task (see the README). One answer for an unknown
task id and another user's: `-32602` `unknown task`. Changes are told to the
listeners (`subscriptions/listen`, `task_notices.py`).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import mcp_types as types
from mcp.shared.exceptions import MCPError

from rift.api.mcp.refusals import INTERNAL
from rift.services.ports.watch import Watch

EXTENSION = "io.modelcontextprotocol/tasks"
POLL_MS = 1000
TTL_MS = 3_600_000  # a task is kept an hour from its creation (at least a minute past its end)
MIN_TTL_MS, MAX_TTL_MS = 60_000, 86_400_000
PER_USER = 200

Status = Literal["working", "completed", "failed", "cancelled"]


def iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class TaskRecord:
    id: str
    user: str
    tool: str
    handle: str | None
    ttl_ms: int
    watch: Watch
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    updated: datetime = field(default_factory=lambda: datetime.now(UTC))
    status: Status = "working"
    result: types.CallToolResult | None = None
    message: str | None = None  # the status line once it ended
    ended_at: float | None = None  # monotonic
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def terminal(self) -> bool:
        return self.status != "working"

    def status_message(self) -> str:
        return self.message if self.message is not None else self.watch.status()

    def modern(self) -> dict[str, Any]:
        """The task as 2026-07-28 `tasks/get` answers it (`DetailedTask`)."""
        out: dict[str, Any] = {
            "taskId": self.id, "status": self.status, "statusMessage": self.status_message(),
            "createdAt": iso(self.created), "lastUpdatedAt": iso(self.updated),
            "ttlMs": self.ttl_ms, "pollIntervalMs": POLL_MS}
        if self.status == "completed" and self.result is not None:
            out["result"] = self.result.model_dump(by_alias=True, mode="json", exclude_none=True)
        elif self.status == "failed":
            out["error"] = {"code": types.INTERNAL_ERROR, "message": INTERNAL["message"]}
        return out

    def legacy(self) -> dict[str, Any]:
        """The task as 2025-11-25 has it (`Task`): a refusal there is a failed task."""
        status = self.status
        if status == "completed" and self.result is not None and self.result.is_error:
            status = "failed"
        return {"taskId": self.id, "status": status, "statusMessage": self.status_message(),
                "createdAt": iso(self.created), "lastUpdatedAt": iso(self.updated),
                "ttl": self.ttl_ms, "pollInterval": POLL_MS}


class TaskBook:
    """This replica's MCP tasks, by id; changes are told to the listeners."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, TaskRecord] = {}
        self._listeners: set[Callable[[TaskRecord], None]] = set()

    def add(self, user: str, tool: str, handle: str | None, ttl_ms: int) -> TaskRecord:
        record = TaskRecord(id=secrets.token_urlsafe(24), user=user, tool=tool, handle=handle,
                            ttl_ms=ttl_ms, watch=Watch())
        with self._lock:
            self._forget_old(user)
            self._tasks[record.id] = record
        return record

    def _forget_old(self, user: str) -> None:
        now_wall, now = datetime.now(UTC), time.monotonic()
        for rec in list(self._tasks.values()):
            kept_ms = (now_wall - rec.created).total_seconds() * 1000
            if rec.ended_at is not None and kept_ms > rec.ttl_ms and now - rec.ended_at > 60:
                del self._tasks[rec.id]
        own = sorted((r for r in self._tasks.values() if r.user == user and r.terminal),
                     key=lambda r: r.created)
        working = sum(1 for r in self._tasks.values() if r.user == user and not r.terminal)
        for rec in own[:max(0, working + len(own) - PER_USER + 1)]:
            del self._tasks[rec.id]

    def drop(self, record: TaskRecord) -> None:
        with self._lock:
            self._tasks.pop(record.id, None)

    def get(self, user: str, task_id: object) -> TaskRecord:
        with self._lock:
            record = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if record is None or record.user != user:
            raise MCPError(types.INVALID_PARAMS, "unknown task")
        return record

    def of_user(self, user: str) -> list[TaskRecord]:
        with self._lock:
            return sorted((r for r in self._tasks.values() if r.user == user),
                          key=lambda r: (r.created, r.id), reverse=True)

    def finish(self, record: TaskRecord, result: types.CallToolResult | None) -> None:
        with self._lock:
            if record.status == "working":  # a cancel is sticky
                record.status = "completed" if result is not None else "failed"
                record.result = result
            record.message = record.watch.status()
            record.updated = datetime.now(UTC)
            record.ended_at = time.monotonic()
        record.done.set()
        self._tell(record)

    def cancel(self, record: TaskRecord) -> None:
        with self._lock:
            record.status = "cancelled"
            record.updated = datetime.now(UTC)
        record.watch.stop()
        self._tell(record)

    def listen(self, listener: Callable[[TaskRecord], None]) -> Callable[[], None]:
        with self._lock:
            self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _tell(self, record: TaskRecord) -> None:
        for listener in list(self._listeners):
            listener(record)
