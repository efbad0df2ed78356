"""What Rift adds to the MCP SDK, each on one of the SDK's extension points, and why.
The SDK owns the protocol: eras, stateless sessions and JSON-RPC framing are its
own (one stateless `StreamableHTTPSessionManager`, `rift.api.mcp`).

1. **Refusals** (`Refusals`, an `Extension.intercept_tool_call`): a `RiftError`
   from a tool is a tool result with `isError`, the text `<code>: <message>` and a
   `hint:` line, and `structuredContent.error` (SPEC §3), not a JSON-RPC error: a
   model reads tool results, and the hint names the tool that mends it. Anything
   else is the one `internal` refusal, logged, with no detail that could carry a
   secret. Every call is counted in `rift_tool_calls_total`.
2. **Who is calling** (`client_name`): the holder label is `mcp:` plus the name
   the client declared. On 2026-07-28 it rides every request's `_meta`. In the
   `initialize` era it comes once, in `initialize`, and Rift runs stateless (any
   replica answers any request), so `Door` answers that handshake with an
   `Mcp-Session-Id` that carries the name (`r1.<nonce>.<name, base64url>`,
   nothing secret), which clients echo on every later request. Claiming another
   name this way is no more than declaring it: the label is for people to read;
   authorization is the token's and the handle's. Else the User-Agent's product
   (`claude-code/1.0 (cli)` → `claude-code`) unless it names an HTTP library.
3. **Clear answers to malformed requests** (`Door`, ASGI, in front of the SDK's
   app): a wrong `Content-Type` (415), a request whose `id` is neither a string
   nor an integer (400: the handshake era's transport takes it for a
   notification and answers 202, so the client waits forever), `GET` (405: Rift
   opens no stream and keeps no session), and the SDK's body-less or plain-text
   4xx answers become JSON-RPC errors that say what was wrong.
4. **A client that went away is not an error** (`ClientGone`, a log filter on the
   SDK's logger): the transport logs a client that left before its body's end
   with a traceback; it becomes one info line.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import secrets
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive, Scope, Send

from rift.api.guard import jsonrpc_error_body
from rift.api.metrics import Metrics
from rift.domain.errors import RiftError
from rift.services.context import Caller

log = logging.getLogger("rift.api.mcp")
OPERATOR_SCOPE = "rift:operator"  # an operator's token (`rift token new USER --operator`)

# -- 1. refusals ----------------------------------------------------------------------

INTERNAL = {"code": "internal", "message": "Rift failed unexpectedly; the error is logged",
            "hint": "call again; if it keeps failing, tell the operator (rift doctor)"}


def result(text: str, structured: dict[str, Any], is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=is_error)


def refusal(error: dict[str, Any]) -> types.CallToolResult:
    return result(f"{error['code']}: {error['message']}\nhint: {error['hint']}",
                  {"error": error}, True)


_NO_STRUCTURED_CONTENT = ("2024-11-05", "2025-03-26")  # eras that read text only


def success(text: str, out: dict[str, Any], protocol_version: str) -> types.CallToolResult:
    """A tool's answer: its text rendering and its output as structured content
    (also as JSON text for the eras that read text only)."""
    if protocol_version in _NO_STRUCTURED_CONTENT:
        text += "\n" + json.dumps(out, ensure_ascii=False, separators=(",", ":"))
    return result(text, out, False)


class Refusals(Extension):
    """Rift's refusals as tool results (see the module's docstring, 1). Not
    advertised to clients: it changes no wire shape, only what a tool answers."""

    identifier = "dev.rift/refusals"

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def intercept_tool_call(self, params: types.CallToolRequestParams,
                                  ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        try:
            answer = await call_next(ctx)
        except MCPError:  # a protocol fault (an unknown tool) stays a JSON-RPC error
            raise
        except RiftError as exc:
            self.metrics.record("mcp", params.name, exc.code)
            log.info("refused", extra={"door": "mcp", "tool": params.name, "code": exc.code})
            return refusal(exc.to_dict())
        except Exception:
            self.metrics.record("mcp", params.name, "internal")
            log.exception("tool call failed", extra={"door": "mcp", "tool": params.name})
            return refusal(dict(INTERNAL))
        self.metrics.record("mcp", params.name, "ok")
        return answer


# -- 2. who is calling ----------------------------------------------------------------

_NAME_MAX = 64
_SESSION_PREFIX = "r1"
_LIBRARIES = frozenset({  # User-Agent products that name an HTTP library, not an agent
    "python-httpx", "python-httpx2", "httpx", "python-requests", "python-urllib", "aiohttp",
    "node", "node-fetch", "undici", "axios", "go-http-client", "okhttp", "java", "mozilla",
})
_PRODUCT_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def clean_name(raw: object) -> str | None:
    """A client's declared name, fit to show people: printable, at most 64 characters."""
    if not isinstance(raw, str):
        return None
    name = " ".join("".join(c if c.isprintable() else " " for c in raw).split())
    return name[:_NAME_MAX] or None


def session_id_for(name: str) -> str:
    encoded = base64.urlsafe_b64encode(name.encode("utf-8")).rstrip(b"=").decode("ascii")
    return f"{_SESSION_PREFIX}.{secrets.token_hex(8)}.{encoded}"


def name_in_session_id(session_id: str | None) -> str | None:
    parts = (session_id or "").split(".")
    if len(parts) != 3 or parts[0] != _SESSION_PREFIX:
        return None
    try:
        raw = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        return clean_name(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def name_in_user_agent(user_agent: str | None) -> str | None:
    first = (user_agent or "").split(" ", 1)[0].split("/", 1)[0]
    if not _PRODUCT_RE.fullmatch(first) or first.lower() in _LIBRARIES:
        return None
    return clean_name(first)


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """The user of the request's token, and the holder label of its client."""
    user = ctx.request.scope.get("user") if isinstance(ctx.request, Request) else None
    token = user.access_token if isinstance(user, AuthenticatedUser) else get_access_token()
    if token is None or token.subject is None:
        raise RuntimeError("an MCP call reached a tool without an authenticated user")
    return Caller(token.subject, f"mcp:{client_name(ctx) or 'unknown'}",
                  operator=OPERATOR_SCOPE in token.scopes)


def client_name(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The name the MCP client declared, wherever its era keeps it."""
    params = ctx.session.client_params  # the handshake's, or a 2026 envelope's
    if params is not None:
        return clean_name(params.client_info.name)
    info = (ctx.meta or {}).get(types.CLIENT_INFO_META_KEY)
    if isinstance(info, dict) and (name := clean_name(info.get("name"))):
        return name
    request = ctx.request
    if not isinstance(request, Request):
        return None
    return (name_in_session_id(request.headers.get("mcp-session-id"))
            or name_in_user_agent(request.headers.get("user-agent")))


def _initialize_name(message: object) -> str | None:
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    info = params.get("clientInfo") if isinstance(params, dict) else None
    return clean_name(info.get("name")) if isinstance(info, dict) else None


def _with_session_id(send: Send, name: str) -> Send:
    session = session_id_for(name).encode("ascii")

    async def named_send(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 200:
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"mcp-session-id", session)]}
        await send(message)

    return named_send


# -- 3. clear answers to malformed requests ---------------------------------------------

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
        if "mcp-session-id" not in headers and (name := _initialize_name(message)):
            send = _with_session_id(send, name)
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


# -- 4. a client that went away ---------------------------------------------------------

class ClientGone(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ClientDisconnect):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "the client went away before its request's end", ()
            record.exc_info = record.exc_text = None
        return True
