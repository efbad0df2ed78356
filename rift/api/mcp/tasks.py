"""MCP Tasks (SPEC §10) for the calls that wait: `rift_vm_exec`, `rift_vm_exec_get`
and `rift_vm_new`, in both eras that have them. The SDK (2.3.0) has the types
but no runtime, so this module is that runtime, on the SDK's extension points:

- **2026-07-28, the extension `io.modelcontextprotocol/tasks`** (`Tasks`, an SDK
  `Extension`): advertised in `server/discover`. A `tools/call` from a client
  that declares the extension in that request's `_meta` gets the ordinary result
  when the call ends within `INLINE_S`, else `resultType: "task"`;
  the `tasks/*` methods are its methods (`task_methods.py`).
- **2025-11-25, the in-core tasks**: the three tools declare
  `execution.taskSupport: "optional"`, `initialize` advertises
  `capabilities.tasks`, and a `tools/call` with `task` answers
  `CreateTaskResult`. That answer is not a `CallToolResult`, which the SDK
  checks a `tools/call` handler's answer against, so it comes from a
  `Server.middleware` (`legacy_task_call`) in front of the handler; the same
  `tasks/*` methods answer that era's shapes.
- **Notifications**: `subscriptions/listen` replaces the SDK's own handler, which
  knows no task events (`task_notices.py`).

A task's call runs in a worker thread of this replica, under a call in flight's
rules (its lease stays active); its record is kept in this replica's task book
(`task_book.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from rift.api.mcp.callers import caller_of
from rift.api.mcp.refusals import INTERNAL, refusal, success
from rift.api.mcp.task_book import EXTENSION, PER_USER, TaskBook, TaskRecord
from rift.api.mcp.task_methods import LEGACY, TaskMethods, waiting_tool
from rift.api.mcp.task_notices import TaskNotices
from rift.api.mcp.tools import tool_named
from rift.api.mcp.waits import WatchedCall, run_watched
from rift.api.metrics import Metrics
from rift.api.waiting import Waiting
from rift.contract.base import parse
from rift.domain.errors import RiftError
from rift.services.context import Caller, Deps
from rift.services.ports.watch import newest_line

log = logging.getLogger("rift.api.mcp")

CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
INLINE_S = 1.0  # a call that ends this soon is answered as a plain call
TTL_MS = 3_600_000  # a task is kept an hour from its creation (at least a minute past its end)
MIN_TTL_MS, MAX_TTL_MS = 60_000, 86_400_000


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
        self.notices = TaskNotices(self.book, self.waiting)
        self.answers = TaskMethods(self.book, deps_of)

    # -- starting ----------------------------------------------------------------------

    def _start(self, ctx: ServerRequestContext[Any, Any], name: str,
               arguments: dict[str, Any] | None, ttl_ms: int) -> TaskRecord:
        """Record the task and run its call in a worker thread. A call that is
        refused before it starts (its arguments) is a task that ended so."""
        caller = caller_of(ctx)
        record = self.book.add(caller.user, name, None, ttl_ms)
        try:
            args = parse(waiting_tool(name).contract.input, arguments, name)
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
            tool = waiting_tool(record.tool)
            answer = run_watched(self.deps_of(), WatchedCall(tool, caller, args, record.watch),
                                 stop_after=True)
            out = answer.model_dump(mode="json")
            result = success(tool.render(out), out, era, tool.more_content(out))
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

    def methods(self) -> Sequence[MethodBinding]:
        return self.answers.methods()


def _final_note(out: dict[str, Any]) -> str:
    """The last news of a call that ended: its VM's state, or its exec's newest
    output line (else its status)."""
    if "vm" in out:
        return f"{out['vm']['id']}: {out['vm']['status']}"
    if "execution" in out:  # a run of code
        out = {**out["execution"], "exec_id": out["execution"]["run_id"]}
    line = newest_line(out.get("stdout", "").encode()) or newest_line(
        out.get("stderr", "").encode())
    return line or f"{out.get('exec_id')}: {out.get('status')}"


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
                               tasks.notices.listen)


def _waits(name: str) -> bool:
    """Whether the tool a call names waits (SPEC §10): only those run as tasks."""
    tool = tool_named(name)
    return tool is not None and tool.waits is not None
