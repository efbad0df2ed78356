"""The `tasks/*` methods of MCP tasks (SPEC §10), in both eras: `tasks/get` (the
status, a `statusMessage` of the seconds and the newest output line, and once
done the inline `result`), `tasks/cancel` and `tasks/update` (an ack: Rift's tasks
never ask for input); 2025-11-25 also has `tasks/result` (waits for the end) and
`tasks/list`. In 2026-07-28 they need the extension declared (`-32021`), and
`tasks/result` and `tasks/list` are `-32601`, as the extension says.

A cancel needs the lease the call started under to be current still (else it is
refused with that refusal, and nothing changes); it kills the exec, or destroys
the VM once its boot ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.extension import MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field
from starlette.requests import Request

from rift.api.mcp.callers import caller_of
from rift.api.mcp.refusals import INTERNAL
from rift.api.mcp.task_book import EXTENSION, TaskBook, TaskRecord
from rift.api.mcp.tools import Tool, tool_named
from rift.api.mcp.waits import WatchedCall, end_made
from rift.domain.errors import RiftError
from rift.services.context import Deps
from rift.services.lifecycle import leases

LEGACY = "2025-11-25"  # the one handshake era with in-core tasks
RELATED_TASK = "io.modelcontextprotocol/related-task"
MISMATCHED_NAME = -32020  # the transport's code for an Mcp-Name header that is not the params'
CANCELLED = -32000  # tasks/result of a cancelled task (2025-11-25 names no code)


class UpdateTaskParams(types.RequestParams):
    """`tasks/update` (2026-07-28): the task and its answers to input requests."""

    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


class TaskMethods:
    """The `tasks/*` methods over one task book; `deps_of` gives the engine a
    cancel calls."""

    def __init__(self, book: TaskBook, deps_of: Callable[[], Deps]) -> None:
        self.book = book
        self.deps_of = deps_of

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
        tool = waiting_tool(record.tool)
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


def waiting_tool(name: str) -> Tool:
    tool = tool_named(name)
    assert tool is not None and tool.waits is not None, name
    return tool
