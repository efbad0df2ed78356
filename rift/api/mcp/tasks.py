"""MCP Tasks (SPEC §10) for the calls that wait: `rift_vm_exec`, `rift_vm_exec_get`
and `rift_vm_new`, in both eras that have them. The SDK (2.3.0) has the types
but no runtime, so this module is that runtime, on the SDK's extension points:

- **2026-07-28, the extension `io.modelcontextprotocol/tasks`** (`Tasks`, an SDK
  `Extension`): advertised in `server/discover`. A `tools/call` from a client
  that declares the extension in that request's `_meta` gets the ordinary result
  when the call ends within `INLINE_S`, else `resultType: "task"`;
  `tasks/get` (the status, a `statusMessage` of the seconds and the newest
  output line, and once done the inline `result`), `tasks/cancel` and
  `tasks/update` (an ack: Rift's tasks never ask for input) are its methods.
  `tasks/*` without the declaration: `-32021`; `tasks/result` and `tasks/list`:
  `-32601`, as the extension says.
- **2025-11-25, the in-core tasks**: the three tools declare
  `execution.taskSupport: "optional"`, `initialize` advertises
  `capabilities.tasks`, and a `tools/call` with `task` answers
  `CreateTaskResult`. That answer is not a `CallToolResult`, which the SDK
  checks a `tools/call` handler's answer against, so it comes from a
  `Server.middleware` (`legacy_task_call`) in front of the handler; `tasks/get`,
  `tasks/result` (waits for the end), `tasks/list` and `tasks/cancel` are the
  same methods as above, answering that era's shapes.
- **Notifications**: `subscriptions/listen` with `notifications.taskIds` sends
  `notifications/tasks` (the task as `tasks/get` answers it) for those of the
  caller's tasks, at each change; the SDK's own listen handler knows no task
  events, so `listen` here replaces it.

One answer for an unknown task id and another user's: `-32602` `unknown task`.
A cancel needs the lease the call started under to be current still (else it is
refused with that refusal, and nothing changes); it kills the exec, or destroys
the VM once its boot ends. A task's call runs in a worker thread of this
replica, under a call in flight's rules (its lease stays active); its record
(at most `PER_USER` per user, kept `TTL_MS` from its creation) lives in this
replica's memory: with several replicas, a client's task calls must reach the
replica that made the task (see the README).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.lowlevel import Server
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field
from starlette.requests import Request

from rift.api.mcp.callers import caller_of
from rift.api.mcp.refusals import INTERNAL, refusal, success
from rift.api.mcp.tools import Tool, tool_named
from rift.api.mcp.waits import WatchedCall, end_made, run_watched
from rift.api.metrics import Metrics
from rift.api.waiting import Waiting
from rift.contract.base import parse
from rift.domain.errors import RiftError, TooManyWaiting
from rift.services.context import Caller, Deps
from rift.services.lifecycle import leases
from rift.services.ports.watch import Watch, newest_line

log = logging.getLogger("rift.api.mcp")

EXTENSION = "io.modelcontextprotocol/tasks"
LEGACY = "2025-11-25"  # the one handshake era with in-core tasks
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
RELATED_TASK = "io.modelcontextprotocol/related-task"
INLINE_S = 1.0  # a call that ends this soon is answered as a plain call
POLL_MS = 1000
TTL_MS = 3_600_000  # a task is kept an hour from its creation (at least a minute past its end)
MIN_TTL_MS, MAX_TTL_MS = 60_000, 86_400_000
PER_USER = 200
MISMATCHED_NAME = -32020  # the transport's code for an Mcp-Name header that is not the params'
CANCELLED = -32000  # tasks/result of a cancelled task (2025-11-25 names no code)

Status = Literal["working", "completed", "failed", "cancelled"]


def _iso(at: datetime) -> str:
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
            "createdAt": _iso(self.created), "lastUpdatedAt": _iso(self.updated),
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
                "createdAt": _iso(self.created), "lastUpdatedAt": _iso(self.updated),
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


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and EXTENSION in capabilities.extensions)


class Tasks(Extension):
    """The runtime of both eras' tasks (see the module's docstring)."""

    identifier = EXTENSION

    def __init__(self, deps_of: Callable[[], Deps], metrics: Metrics,
                 waiting: Waiting | None = None) -> None:
        self.deps_of = deps_of
        self.metrics = metrics
        self.book = TaskBook()
        # a task working holds one of its user's places (RIFT_MAX_WAITING_PER_USER)
        self.waiting = waiting if waiting is not None else Waiting(PER_USER)

    # -- starting ----------------------------------------------------------------------

    def _start(self, ctx: ServerRequestContext[Any, Any], name: str,
               arguments: dict[str, Any] | None, ttl_ms: int) -> TaskRecord:
        """Record the task and run its call in a worker thread. A call that is
        refused before it starts (its arguments) is a task that ended so."""
        caller = caller_of(ctx)
        record = self.book.add(caller.user, name, None, ttl_ms)
        try:
            args = parse(_waiting(name).contract.input, arguments, name)
            give = self.waiting.take(caller.user)
        except RiftError as exc:
            self.metrics.record("mcp", name, exc.code)
            record.watch.note(f"refused: {exc.code}")
            self.book.finish(record, refusal(exc.to_dict()))
            return record
        record.handle = getattr(args, "handle", None)
        era = ctx.protocol_version
        try:
            threading.Thread(target=self._run, args=(record, caller, args, era, give),
                             daemon=True, name=f"rift-mcp-task-{name}").start()
        except BaseException:
            give()
            raise
        return record

    def _run(self, record: TaskRecord, caller: Caller, args: BaseModel, era: str,
             give: Callable[[], None]) -> None:
        try:
            self._work(record, caller, args, era)
        finally:
            give()

    def _work(self, record: TaskRecord, caller: Caller, args: BaseModel, era: str) -> None:
        result: types.CallToolResult | None
        try:
            tool = _waiting(record.tool)
            answer = run_watched(self.deps_of(), WatchedCall(tool, caller, args, record.watch),
                                 stop_after=True)
            out = answer.model_dump(mode="json")
            result = success(tool.render(out), out, era)
            record.watch.note(_final_note(out))
            self.metrics.record("mcp", record.tool, "ok")
        except RiftError as exc:
            self.metrics.record("mcp", record.tool, exc.code)
            result = refusal(exc.to_dict())
            record.watch.note(f"refused: {exc.code}")
        except Exception:
            self.metrics.record("mcp", record.tool, "internal")
            log.exception("task call failed", extra={"door": "mcp", "tool": record.tool})
            result = None
        self.book.finish(record, result)

    async def intercept_tool_call(self, params: types.CallToolRequestParams,
                                  ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        """2026-07-28: a call of a waiting tool from a client that declared the
        extension becomes a task unless it ends within `INLINE_S`."""
        if (ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or not _waits(params.name)
                or not declared(ctx)):
            return await call_next(ctx)
        record = self._start(ctx, params.name, params.arguments, TTL_MS)
        with anyio.move_on_after(INLINE_S):
            while not record.done.is_set():
                await anyio.sleep(0.01)
        if record.done.is_set() and record.status != "cancelled":
            self.book.drop(record)
            return record.result if record.result is not None else refusal(dict(INTERNAL))
        return {"resultType": "task", **{k: v for k, v in record.modern().items()
                                         if k not in ("result", "error")}}

    async def legacy_task_call(self, ctx: ServerRequestContext[Any, Any],
                               call_next: CallNext) -> HandlerResult:
        """2025-11-25: a `tools/call` with `task` answers `CreateTaskResult` (a
        middleware: see the module's docstring)."""
        raw = ctx.params if isinstance(ctx.params, dict) else None
        if (ctx.method != "tools/call" or ctx.protocol_version != LEGACY or raw is None
                or raw.get("task") is None):
            return await call_next(ctx)
        params = types.CallToolRequestParams.model_validate(raw)
        if not _waits(params.name):
            raise MCPError(types.METHOD_NOT_FOUND,
                           f"{params.name[:100]} does not run as a task (taskSupport forbidden)")
        asked = params.task.ttl if params.task is not None else None
        ttl = TTL_MS if asked is None else max(MIN_TTL_MS, min(MAX_TTL_MS, asked))
        record = self._start(ctx, params.name, params.arguments, ttl)
        return {"task": record.legacy()}

    # -- the methods -------------------------------------------------------------------

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", types.GetTaskRequestParams, self.get),
            MethodBinding("tasks/cancel", types.CancelTaskRequestParams, self.cancel),
            MethodBinding("tasks/update", UpdateTaskParams, self.update),
            MethodBinding("tasks/result", types.GetTaskPayloadRequestParams, self.result),
            MethodBinding("tasks/list", types.PaginatedRequestParams, self.list),
        )

    def _own(self, ctx: ServerRequestContext[Any, Any], task_id: object) -> TaskRecord:
        """The caller's task of that id, in an era that has tasks and with the
        declaration 2026-07-28 asks for."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            require_client_extension(ctx, EXTENSION)
            header = ctx.request.headers.get("mcp-name") if isinstance(ctx.request, Request) \
                else None
            if header is not None and header != task_id:
                raise MCPError(MISMATCHED_NAME, "the Mcp-Name header is not the params' taskId")
        elif ctx.protocol_version != LEGACY:
            raise MCPError(types.METHOD_NOT_FOUND, f"Method not found: {ctx.method}")
        return self.book.get(caller_of(ctx).user, task_id)

    @staticmethod
    def _legacy_only(ctx: ServerRequestContext[Any, Any]) -> None:
        if ctx.protocol_version != LEGACY:  # the extension removed them
            raise MCPError(types.METHOD_NOT_FOUND, f"Method not found: {ctx.method}")

    async def get(self, ctx: ServerRequestContext[Any, Any],
                  params: types.GetTaskRequestParams) -> dict[str, Any]:
        record = self._own(ctx, params.task_id)
        return record.modern() if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS \
            else record.legacy()

    async def update(self, ctx: ServerRequestContext[Any, Any],
                     params: UpdateTaskParams) -> dict[str, Any]:
        self._own(ctx, params.task_id)
        return {}  # Rift's tasks ask for no input: every response is one it ignores

    async def cancel(self, ctx: ServerRequestContext[Any, Any],
                     params: types.CancelTaskRequestParams) -> dict[str, Any]:
        record = self._own(ctx, params.task_id)
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if record.terminal:
            if modern:
                return {}
            raise MCPError(types.INVALID_PARAMS, f"the task is {record.legacy()['status']} "
                           "already")
        deps, caller = self.deps_of(), caller_of(ctx)
        try:  # the lease the call started under must be current still
            await anyio.to_thread.run_sync(leases.hold, deps, caller, record.handle)
        except RiftError as exc:
            raise MCPError(types.INVALID_REQUEST, f"{exc.code}: {exc.message}",
                           data={"error": exc.to_dict()}) from exc
        self.book.cancel(record)
        target = record.watch.target
        tool = _waiting(record.tool)
        assert tool.waits is not None
        if target is not None and tool.waits.task_cancel_stops_now:  # a VM: once it booted
            await anyio.to_thread.run_sync(end_made, deps,
                                           WatchedCall(tool, caller, None, record.watch),
                                           record.handle, target)
        return {} if modern else record.legacy()

    async def result(self, ctx: ServerRequestContext[Any, Any],
                     params: types.GetTaskPayloadRequestParams) -> dict[str, Any]:
        self._legacy_only(ctx)
        record = self._own(ctx, params.task_id)
        while not record.terminal:
            await anyio.sleep(0.05)
        if record.status == "cancelled":
            raise MCPError(CANCELLED, "the task was cancelled")
        if record.result is None:
            raise MCPError(types.INTERNAL_ERROR, INTERNAL["message"])
        out = record.result.model_dump(by_alias=True, mode="json", exclude_none=True)
        out.setdefault("_meta", {})[RELATED_TASK] = {"taskId": record.id}
        return out

    async def list(self, ctx: ServerRequestContext[Any, Any],
                   params: types.PaginatedRequestParams | None) -> dict[str, Any]:
        self._legacy_only(ctx)
        records = self.book.of_user(caller_of(ctx).user)
        cursor = params.cursor if params is not None else None
        if cursor is not None:
            ids = [r.id for r in records]
            if cursor not in ids:
                raise MCPError(types.INVALID_PARAMS, "unknown cursor")
            records = records[ids.index(cursor) + 1:]
        page = records[:50]
        out: dict[str, Any] = {"tasks": [r.legacy() for r in page]}
        if len(records) > len(page):
            out["nextCursor"] = page[-1].id
        return out

    # -- notifications -----------------------------------------------------------------

    async def listen(self, ctx: ServerRequestContext[Any, Any],
                     params: types.SubscriptionsListenRequestParams) -> dict[str, Any]:
        """`subscriptions/listen`: acknowledge the caller's own `taskIds`, then send
        `notifications/tasks` at each change of those tasks until the client goes."""
        if ctx.request_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen requires a request id")
        asked = (params.notifications.model_extra or {}).get("taskIds") \
            if params.notifications is not None else None
        user = caller_of(ctx).user
        honored: list[str] = []
        if asked:
            require_client_extension(ctx, EXTENSION)
            own = {r.id for r in self.book.of_user(user)}
            honored = [t for t in asked if isinstance(t, str) and t in own][:100]
        meta = {"io.modelcontextprotocol/subscriptionId": ctx.request_id}
        try:
            give = self.waiting.take(user)  # a listen waits: one of the user's places
        except TooManyWaiting as exc:
            raise MCPError(types.INVALID_REQUEST, f"{exc.code}: {exc.message}; hint: {exc.hint}",
                           exc.to_dict()) from None
        try:
            await self._listened(ctx, honored, meta)
        finally:
            give()
        return {"_meta": meta}

    async def _listened(self, ctx: ServerRequestContext[Any, Any], honored: Sequence[str],
                        meta: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        send, receive = anyio.create_memory_object_stream[TaskRecord](256)

        def heard(record: TaskRecord) -> None:
            if record.id in honored:
                loop.call_soon_threadsafe(_offer, send, record)

        stop = self.book.listen(heard)
        try:
            await ctx.session.send_notification(
                _Notice(method="notifications/subscriptions/acknowledged",  # type: ignore[arg-type]
                        params={"notifications": {"taskIds": honored}, "_meta": meta}),
                related_request_id=ctx.request_id)
            async for record in receive:
                await ctx.session.send_notification(
                    _Notice(method="notifications/tasks",  # type: ignore[arg-type]
                            params={**record.modern(), "_meta": meta}),
                    related_request_id=ctx.request_id)
        finally:
            stop()
            send.close()
            receive.close()


class UpdateTaskParams(types.RequestParams):
    """`tasks/update` (2026-07-28): the task and its answers to input requests."""

    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


def _final_note(out: dict[str, Any]) -> str:
    """The last news of a call that ended: its VM's state, or its exec's newest
    output line (else its status)."""
    if "vm" in out:
        return f"{out['vm']['id']}: {out['vm']['status']}"
    line = newest_line(out.get("stdout", "").encode()) or newest_line(
        out.get("stderr", "").encode())
    return line or f"{out.get('exec_id')}: {out.get('status')}"


class _Notice(BaseModel):
    """A notification the SDK has no type for (`notifications/tasks`), or one whose
    params the SDK's type would trim (the `taskIds` of an acknowledgement)."""

    method: str
    params: dict[str, Any]


def _offer(send: Any, record: TaskRecord) -> None:
    # A listener that stopped reading misses a change; tasks/get still answers.
    with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
        send.send_nowait(record)


LEGACY_CAPABILITY = types.ServerTasksCapability(
    list=types.TasksListCapability(), cancel=types.TasksCancelCapability(),
    requests=types.ServerTasksRequestsCapability(
        tools=types.TasksToolsCapability(call=types.TasksCallCapability())))


class TaskServer(Server[Any]):
    """The lowlevel server, advertising 2025-11-25's `capabilities.tasks` in
    `initialize` (`server/discover` passes its era and gets none: there the
    extension is the way)."""

    def get_capabilities(self, notification_options: Any = None,
                         experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                         extensions: dict[str, dict[str, Any]] | None = None, *,
                         protocol_version: str | None = None) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(notification_options, experimental_capabilities,
                                                extensions, protocol_version=protocol_version)
        if protocol_version is None:
            capabilities.tasks = LEGACY_CAPABILITY
        return capabilities


def install_tasks(server: Server[Any], tasks: Tasks) -> None:
    """What the extension API does not reach: the 2025-11-25 middleware and the
    listen handler (`subscriptions/listen` is a spec method)."""
    server.middleware.append(tasks.legacy_task_call)
    server.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams,
                               tasks.listen)


def _waits(name: str) -> bool:
    """Whether the tool a call names waits (SPEC §10): only those run as tasks."""
    tool = tool_named(name)
    return tool is not None and tool.waits is not None


def _waiting(name: str) -> Tool:
    tool = tool_named(name)
    assert tool is not None and tool.waits is not None, name
    return tool
