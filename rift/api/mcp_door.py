"""The ASGI door at `/mcp`, behind the SDK's bearer middleware: era routing in
front of the SDK's stateless session managers.

Protocol `2026-07-28` goes straight to the SDK (it answers a quick call as JSON and
a slow one as server-sent events with keep-alive pings). The handshake era's
transport answers every POST as an event stream when asked to stream, which costs
about a millisecond per call; so a small POST whose outcome is quick (a call of a
tool that touches no hypervisor or guest, a listing, the handshake) goes to a
JSON-answering manager, and the rest (VM boots, execs, files, teardown, which may
run for minutes) to the streaming one, whose pings keep proxies and client
timeouts from cutting a long call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from rift.api.mcp_names import initialize_name, with_session_id

MAX_BODY = 40 * 1024 * 1024  # 16 MiB of content, base64-encoded and JSON-escaped, fits
_PEEK_LIMIT = 64 * 1024  # larger bodies are file writes: streamed, never read twice


class McpDoor:
    def __init__(self, server: Server[Any], quick_tools: frozenset[str]) -> None:
        self.server = server
        self.quick_tools = quick_tools
        self.streaming: StreamableHTTPSessionManager | None = None
        self.quick: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the SDK's managers (a manager runs once: each lifespan makes new ones)."""
        streaming = StreamableHTTPSessionManager(
            app=self.server, stateless=True, max_request_body_size=MAX_BODY)
        quick = StreamableHTTPSessionManager(
            app=self.server, stateless=True, json_response=True, max_request_body_size=MAX_BODY)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(streaming.run())
            await stack.enter_async_context(quick.run())
            self.streaming, self.quick = streaming, quick
            try:
                yield
            finally:
                self.streaming = self.quick = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming, quick = self.streaming, self.quick
        if streaming is None or quick is None:
            await Response("MCP is not running", 503)(scope, receive, send)
            return
        headers = Headers(scope=scope)
        era = headers.get("mcp-protocol-version")
        if era is not None and era not in HANDSHAKE_PROTOCOL_VERSIONS:
            await streaming.handle_request(scope, receive, send)
            return
        if scope["method"] in ("GET", "DELETE"):
            # Rift sends nothing unasked and keeps no session to end (the spec allows 405).
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        if scope["method"] != "POST":
            await streaming.handle_request(scope, receive, send)
            return
        receive, message = await _peek(headers, receive)
        if "mcp-session-id" not in headers and (name := initialize_name(message)):
            send = with_session_id(send, name)
        manager = quick if self._is_quick(message) else streaming
        await manager.handle_request(scope, receive, send)

    def _is_quick(self, message: object) -> bool:
        if not isinstance(message, dict):
            return False
        if message.get("method") != "tools/call":
            return True
        params = message.get("params")
        return isinstance(params, dict) and params.get("name") in self.quick_tools


async def _peek(headers: Headers, receive: Receive) -> tuple[Receive, object]:
    """A small body's JSON (None when large, chunked or not JSON), and a `receive`
    that replays the body to the SDK."""
    length = headers.get("content-length", "")
    if not length.isdigit() or int(length) > _PEEK_LIMIT:
        return receive, None
    chunks: list[bytes] = []
    after: list[Message] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            after.append(message)
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed: list[Message] = [{"type": "http.request", "body": body, "more_body": False},
                               *after]

    async def replay() -> Message:
        return replayed.pop(0) if replayed else await receive()

    try:
        return replay, json.loads(body)
    except ValueError:
        return replay, None
