"""**Clear answers to malformed requests** (`Door`, ASGI, in front of the SDK's
app): a wrong `Content-Type` (415), a request whose `id` is neither a string
nor an integer (400: the handshake era's transport takes it for a
notification and answers 202, so the client waits forever), `GET` (405: Rift
opens no stream and keeps no session), and the SDK's body-less or plain-text
   4xx answers become JSON-RPC errors that say what was wrong.

**A large body is parsed off the event loop** (SPEC §15): the SDK's transport
reads and parses the body on the loop, where every other call (and `/healthz`)
waits for it (a 38 MiB body of small numbers stopped the whole server for
~0.9 s). The Door reads a body over 64 KiB itself and has it parsed in a process
of its own (`parsing`: a thread would hold the GIL throughout), with the parser
the SDK's transport for that era uses; the SDK's own parse of those very bytes
then answers what that gave (`_ParsedFirst`). A large body of more than
`parsing.MAX_VALUES` JSON values is refused with 413 before the SDK sees it.

**A client that went away is not an error** (`ClientGone`, a log filter on the
SDK's logger): the transport logs a client that left before its body's end
with a traceback; it becomes one info line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import anyio
from mcp.server import _streamable_http_modern, streamable_http
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from rift.api.guard import jsonrpc_error_body, send_refusal, too_many_values
from rift.api.mcp.callers import initialize_name, with_session_id
from rift.api.parsing import MAX_VALUES, TooManyValues, parse_body

log = logging.getLogger("rift.api.mcp")


_PEEK_LIMIT = 64 * 1024  # a larger body is parsed in a worker thread
_WHY = {405: "Method Not Allowed: POST /mcp only; Rift opens no GET stream and keeps no "
             "session",
        406: "Not Acceptable: the Accept header must list application/json and "
             "text/event-stream",
        415: "Unsupported Media Type: POST /mcp takes Content-Type: application/json"}


class Door:
    """`/mcp` in front of the SDK's session manager (see the module's docstring, 2-3)."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None
        _ParsedFirst.install()

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
        receive, parsed = await _peek(receive, _stdlib_parse(headers))
        if isinstance(parsed.outcome, TooManyValues):
            await send_refusal(send, 413, too_many_values(parsed.outcome.seen, MAX_VALUES),
                               mcp=True)
            return
        message = None if parsed.failed else parsed.outcome
        if _bad_id(message):
            await _jsonrpc_error(send, 400, "Invalid Request: id must be a string or an integer")
            return
        if "mcp-session-id" not in headers and (name := initialize_name(message)):
            send = with_session_id(send, name)
        held = _PARSED.set(parsed if parsed.body is not None else None)
        try:
            await manager.handle_request(scope, receive, send)
        finally:
            parsed.body = parsed.outcome = None  # its memory goes with the request
            _PARSED.reset(held)


@dataclass
class _Parsed:
    """A body and what parsing it gave: its value, or the error (`failed`). `body`
    is None once the SDK has had it (or for a small body, which the SDK parses)."""

    body: bytes | None
    outcome: Any
    failed: bool


_PARSED: ContextVar[_Parsed | None] = ContextVar("rift_mcp_parsed", default=None)


def _stdlib_parse(headers: Headers) -> bool:
    """Whether the SDK's transport for this request parses with `json.loads` (the
    stateless era's) rather than `pydantic_core.from_json` (the handshake era's):
    the era as the session manager tells it, by the protocol version header."""
    version = headers.get("mcp-protocol-version")
    return version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS


def _parse(body: bytes, stdlib: bool) -> _Parsed:
    """`body` parsed in the parser process (rift.api.parsing)."""
    parsed = parse_body(body, stdlib)
    if parsed.error is not None:
        return _Parsed(body, parsed.error, True)
    return _Parsed(body, parsed.value, False)


class _ParsedFirst:
    """Stands for a module (`json`, `pydantic_core`) in the SDK's transports: their
    parse of a request's body (`loads`, `from_json`) answers what the Door parsed off
    the loop for this request when the bytes are those (once); anything else is the
    module's own."""

    def __init__(self, module: ModuleType, parse: str) -> None:
        self._module = module
        self._own: Callable[..., Any] = getattr(module, parse)
        setattr(self, parse, self._parse)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def _parse(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        parsed = _PARSED.get()
        if parsed is None or parsed.body is None or not isinstance(data, bytes) \
                or len(data) != len(parsed.body) or data != parsed.body:
            return self._own(data, *args, **kwargs)
        outcome, parsed.body = parsed.outcome, None
        if parsed.failed:
            raise outcome
        return outcome

    @staticmethod
    def install() -> None:
        """In the SDK's two transports: the stateless era's parses with `json.loads`,
        the handshake era's with `pydantic_core.from_json` (done once)."""
        for module, name, parse in ((_streamable_http_modern, "json", "loads"),
                                    (streamable_http, "pydantic_core", "from_json")):
            current = getattr(module, name)
            if not isinstance(current, _ParsedFirst):
                setattr(module, name, _ParsedFirst(current, parse))


async def _peek(receive: Receive, stdlib: bool) -> tuple[Receive, _Parsed]:
    """The body, parsed (over `_PEEK_LIMIT` in the parser process, as `json.loads`
    or, not `stdlib`, as `pydantic_core.from_json` would, and kept for the SDK's
    parse; `failed` when it is not JSON), and a `receive` that replays the body to
    the SDK."""
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
    # A body cut short (the client left, or BodyGuard stopped it) is replayed as such.
    replayed: list[Message] = [{"type": "http.request", "body": body,
                                "more_body": bool(after)}, *after]

    async def replay() -> Message:
        return replayed.pop(0) if replayed else await receive()

    if after:
        return replay, _Parsed(None, None, True)
    if len(body) > _PEEK_LIMIT:
        return replay, await anyio.to_thread.run_sync(_parse, body, stdlib)
    try:
        return replay, _Parsed(None, json.loads(body), False)
    except (ValueError, RecursionError) as exc:  # RecursionError: deep nesting
        return replay, _Parsed(None, exc, True)


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
