"""Notifications of MCP tasks (SPEC §10): `subscriptions/listen` with
`notifications.taskIds` sends `notifications/tasks` (the task as `tasks/get`
answers it) for those of the caller's tasks, at each change. The SDK's own listen
handler knows no task events, so this one replaces it (`tasks.install_tasks`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from rift.api.mcp.callers import caller_of
from rift.api.mcp.task_book import EXTENSION, TaskBook, TaskRecord
from rift.api.waiting import Waiting
from rift.domain.errors import TooManyWaiting


class TaskNotices:
    """`subscriptions/listen` for the tasks of one book; a listen waits, so it holds
    one of its user's places (`waiting`)."""

    def __init__(self, book: TaskBook, waiting: Waiting) -> None:
        self.book = book
        self.waiting = waiting

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


class _Notice(BaseModel):
    """A notification the SDK has no type for (`notifications/tasks`), or one whose
    params the SDK's type would trim (the `taskIds` of an acknowledgement)."""

    method: str
    params: dict[str, Any]


def _offer(send: Any, record: TaskRecord) -> None:
    # A listener that stopped reading misses a change; tasks/get still answers.
    with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
        send.send_nowait(record)

