"""**Clear answers to malformed requests** (`Door`, ASGI, in front of the SDK's
app): a wrong `Content-Type` (415), a request whose `id` is neither a string
nor an integer (400: the handshake era's transport takes it for a
notification and answers 202, so the client waits forever), `GET` (405: Rift
opens no stream and keeps no session), and the SDK's body-less or plain-text
   4xx answers become JSON-RPC errors that say what was wrong.

**A client that went away is not an error** (`ClientGone`, a log filter on the
SDK's logger): the transport logs a client that left before its body's end
with a traceback; it becomes one info line.
"""

from __future__ import annotations

import json
import logging

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from rift.api.guard import jsonrpc_error_body
from rift.api.mcp.callers import initialize_name, with_session_id

log = logging.getLogger("rift.api.mcp")


_PEEK_LIMIT = 64 * 1024  # larger bodies are file writes: streamed, never read twice
_WHY = {405: "Method Not Allowed: POST /mcp only; Rift opens no GET stream and keeps no "
             "session",
        406: "Not Acceptable: the Accept header must list application/json and "
             "text/event-stream",
        415: "Unsupported Media Type: POST /mcp takes Content-Type: application/json"}


class Door:
    """`/mcp` in front of the SDK's session manager (see the module's docstring, 2-3)."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self.manager
        if manager is None:
            await _jsonrpc_error(send, 503, "MCP is not running")
            return
        send = _clear_errors(send)
        if scope["method"] != "POST":
            await _jsonrpc_error(send, 405, _WHY[405], [(b"allow", b"POST")])
            return
        headers = Headers(scope=scope)
        if headers.get("content-type", "").partition(";")[0].strip().lower() != (
                "application/json"):
            await _jsonrpc_error(send, 415, _WHY[415])
            return
        receive, message = await _peek(headers, receive)
        if _bad_id(message):
            await _jsonrpc_error(send, 400, "Invalid Request: id must be a string or an integer")
            return
        if "mcp-session-id" not in headers and (name := initialize_name(message)):
            send = with_session_id(send, name)
        await manager.handle_request(scope, receive, send)


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


def _clear_errors(send: Send) -> Send:
    """The SDK's body-less or plain-text 4xx answers as JSON-RPC errors that say what
    was wrong (its JSON answers pass unchanged)."""
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




class ClientGone(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ClientDisconnect):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "the client went away before its request's end", ()
            record.exc_info = record.exc_text = None
        return True
