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

Malformed input gets a JSON-RPC error with a clear message, never an empty or
plain-text body: a wrong `Content-Type` (415), a request whose `id` is neither a
string nor an integer (400; the handshake era's SDK took it for a notification
and answered 202, so the client waited forever), and the SDK's own body-less or
plain-text 4xx answers (405 for GET, 406 for a missing `Accept`). Oversized and
trickling bodies are refused in front of every route (`rift.api.guard`); the SDK's
own limit stays as a second fence.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from rift.api.guard import MAX_BODY, jsonrpc_error_body
from rift.api.mcp_names import initialize_name, with_session_id

_PEEK_LIMIT = 64 * 1024  # larger bodies are file writes: streamed, never read twice


class McpDoor:
    def __init__(self, server: Server[Any], quick_tools: frozenset[str],
                 security: TransportSecuritySettings) -> None:
        self.server = server
        self.security = security
        self.quick_tools = quick_tools
        self.streaming: StreamableHTTPSessionManager | None = None
        self.quick: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the SDK's managers (a manager runs once: each lifespan makes new ones)."""
        streaming = StreamableHTTPSessionManager(
            app=self.server, stateless=True, max_request_body_size=MAX_BODY,
            security_settings=self.security)
        quick = StreamableHTTPSessionManager(
            app=self.server, stateless=True, json_response=True, max_request_body_size=MAX_BODY,
            security_settings=self.security)
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
        send = _clear_errors(send)
        if scope["method"] != "POST":
            # Rift sends nothing unasked (no GET stream) and keeps no session to end (the
            # spec allows 405).
            await _jsonrpc_error(send, 405, "Method Not Allowed: POST /mcp only; Rift opens "
                                 "no GET stream and keeps no session", [(b"allow", b"POST")])
            return
        if not _is_json(headers.get("content-type", "")):
            await _jsonrpc_error(send, 415, _WHY[415])
            return
        era = headers.get("mcp-protocol-version")
        if era is not None and era not in HANDSHAKE_PROTOCOL_VERSIONS:
            await streaming.handle_request(scope, receive, send)
            return
        receive, message = await _peek(headers, receive)
        if _bad_id(message):
            await _jsonrpc_error(send, 400, "Invalid Request: id must be a string or an integer")
            return
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
    except (ValueError, RecursionError):  # RecursionError: deep nesting
        return replay, None


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == "application/json"


def _bad_id(message: object) -> bool:
    """A request (it has a method) whose id is not a string or an integer."""
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return False
    ident = message["id"]
    return not isinstance(ident, str) and (not isinstance(ident, int) or isinstance(ident, bool))


async def _jsonrpc_error(send: Send, status: int, message: str,
                         headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = jsonrpc_error_body(message)
    raw = [*(headers or []), (b"content-type", b"application/json"),
           (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


_WHY = {405: "Method Not Allowed: POST /mcp only",
        406: "Not Acceptable: the Accept header must list application/json and "
             "text/event-stream",
        415: "Unsupported Media Type: POST /mcp takes Content-Type: application/json"}


def _clear_errors(send: Send) -> Send:
    """Turn the SDK's body-less or plain-text 4xx answers into JSON-RPC errors that
    say what was wrong (its JSON answers pass unchanged)."""
    held: Message | None = None
    chunks: list[bytes] = []

    async def sending(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start":
            kind = Headers(raw=message.get("headers", [])).get("content-type", "")
            if 400 <= message["status"] < 500 and not kind.startswith("application/json"):
                held = message
                return
        elif held is not None and message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            status = held["status"]
            said = b"".join(chunks).decode("utf-8", "replace").strip()[:300]
            why = _WHY.get(status) or said or f"HTTP {status}"
            kept = [(k, v) for k, v in held.get("headers", [])
                    if k.lower() not in (b"content-type", b"content-length")]
            await _jsonrpc_error(send, status, why, kept)
            return
        await send(message)

    return sending
