"""The official MCP SDK client against a real `rift serve`, in exactly one
protocol era: sessions, tool calls that must succeed or be refused, and the
protocol eras and refusal codes the MCP tests know."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

MODERN = "2026-07-28"
ERAS = (MODERN, "2025-11-25", "2025-06-18", "2025-03-26")
WAIT_S = 30
REFUSAL_CODES = {
    "handle_required", "handle_invalid", "task_not_found", "task_closed", "task_released",
    "lease_stale", "task_held", "vm_not_found", "vm_not_running", "quota_exceeded",
    "no_capacity", "image_not_found", "invalid_argument", "idempotency_conflict",
    "rate_limited", "unauthorized", "guest_unreachable", "hypervisor_error", "exec_not_found",
    "snapshot_not_found", "volume_not_found", "volume_busy", "context_not_found",
    "build_failed",
}



T = TypeVar("T")

def run(scenario: Callable[[], Awaitable[T]], limit_s: float = WAIT_S) -> T:
    """Run an async scenario to its end and answer what it answers, or fail after
    `limit_s`."""
    async def bounded() -> T:
        with anyio.fail_after(limit_s):
            return await scenario()

    return anyio.run(bounded)


def http_client(token: str | None, statuses: list[int] | None = None) -> httpx2.AsyncClient:
    """The HTTP client under the SDK's transport; `statuses` collects every answer's."""
    async def note(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.AsyncClient(headers=headers, timeout=WAIT_S,
                              event_hooks={"response": [note]})


@asynccontextmanager
async def mcp_session(url: str, token: str, name: str = "rift-tests", era: str = MODERN,
                      statuses: list[int] | None = None) -> AsyncIterator[ClientSession]:
    """An SDK `ClientSession` at exactly this protocol version: `server/discover` for
    2026-07-28, else the `initialize` handshake offering `era`."""
    info = types.Implementation(name=name, version="1.0")
    async with (http_client(token, statuses) as http,
                streamable_http_client(url + "/mcp", http_client=http) as (read, write),
                ClientSession(read, write, client_info=info) as session):
        if era == MODERN:
            await session.discover()
        else:
            result = await session.send_request(types.InitializeRequest(
                params=types.InitializeRequestParams(
                    protocol_version=era, capabilities=types.ClientCapabilities(),
                    client_info=info)), types.InitializeResult)
            assert result.protocol_version == era
            session.adopt(result)
            await session.send_notification(types.InitializedNotification())
        assert session.protocol_version == era
        yield session


async def call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call that must succeed: its structured content (the SDK client has
    checked it against the tool's outputSchema)."""
    result = await session.call_tool(tool, args)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    assert result.content and isinstance(result.content[0], types.TextContent)
    assert result.content[0].text
    return result.structured_content


async def refused(session: ClientSession, code: str, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call that must be refused with `code`: the refusal's error object."""
    result = await session.call_tool(tool, args)
    assert result.is_error, result.structured_content
    assert isinstance(result.structured_content, dict)
    error = result.structured_content["error"]
    assert error["code"] == code, error
    assert error["message"] and error["hint"], error
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert text.text.startswith(f"{code}: {error['message']}"), text.text
    return dict(error)


def innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
