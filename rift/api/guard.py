"""The HTTP door's guards against bad input that is not a request's content:
bodies over the limit, bodies that trickle in, request heads that never end.

- `BodyGuard` (ASGI, in front of every route): a body over its route's limit
  (`rift.api.gate.body_limit`: 64 KiB of plain JSON, `MAX_BODY` where content rides) is refused
  with 413 as soon as its `Content-Length` says so, or, without one (chunked), as
  soon as the bytes counted on arrival pass the limit; nothing is buffered. The
  rest of such a body is read and dropped by uvicorn (for at most
  `RIFT_HEADER_TIMEOUT_S`, the deadline of the next request's head) rather than
  the connection closed at once: a client still sending would get a reset, not
  the 413 (the MCP SDK's client saw `ReadError`). A body that has not fully
  arrived `RIFT_BODY_TIMEOUT_S` after the app first asked for it is refused with
  408 and the connection closed. REST gets the usual `{"error": {...}}`; `/mcp`
  gets a JSON-RPC error carrying the same object as its `data`, which MCP clients
  show as they are.
- `guarded_h11`: uvicorn's h11 protocol with a deadline for the request head. A
  connection must deliver a complete request line and headers within
  `RIFT_HEADER_TIMEOUT_S` of opening, or of its previous response's end; else it is
  closed (with a 408 when part of a head had come). uvicorn's own keep-alive
  timeout only covers a connection that sends nothing after a response: one that
  never sends anything, or sends a head slowly, was held forever.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anyio
import h11
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_BODY = 40 * 1024 * 1024  # 16 MiB of file content, base64-encoded and JSON-escaped, fits
MAX_BODY_MIB = MAX_BODY // (1024 * 1024)
JSONRPC_INVALID_REQUEST = -32600


def refusal(why: str, hint: str, **details: Any) -> dict[str, Any]:
    """The `invalid_argument` object (SPEC §4) for input that was not a request's content."""
    return {"code": "invalid_argument", "message": why, "hint": hint, **details}


def _size(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit // 1024} KiB"


def too_large(field: str = "body", limit: int = MAX_BODY) -> dict[str, Any]:
    if limit >= MAX_BODY:
        hint = (f"send at most {_size(limit)} in one request; file content is at most 16 MiB "
                "(rift_vm_write_file, PUT /api/v1/vms/{id}/files)")
    else:
        hint = (f"this route takes at most {_size(limit)}; file content, exec stdin and exec "
                "input go to their own routes (PUT /api/v1/vms/{id}/files, "
                "POST /api/v1/vms/{id}/exec, POST /api/v1/execs/{id}/input), up to 16 MiB")
    return refusal(f"{field}: over the limit of {limit} bytes ({_size(limit)}) per request",
                   hint, field=field, limit_bytes=limit)


def too_many_values(seen: int, limit: int) -> dict[str, Any]:
    return refusal(f"body: more than {limit} JSON values ({seen} seen)",
                   "a large body carries its bulk in strings (file content, exec stdin or "
                   f"input); send at most {limit} JSON values in one",
                   field="body", limit_values=limit)


def too_slow(timeout_s: float, received: int) -> dict[str, Any]:
    return refusal(
        f"body: not all of it arrived within {timeout_s:g} s ({received} bytes came)",
        f"send the whole body within {timeout_s:g} s (RIFT_BODY_TIMEOUT_S), then call again",
        field="body", timeout_s=timeout_s)


def head_too_slow(timeout_s: float) -> dict[str, Any]:
    return refusal(
        f"request: the request line and headers did not arrive within {timeout_s:g} s",
        f"send the request line and headers at once, within {timeout_s:g} s "
        "(RIFT_HEADER_TIMEOUT_S)", field="request", timeout_s=timeout_s)


def jsonrpc_error_body(message: str, data: dict[str, Any] | None = None) -> bytes:
    """A JSON-RPC error answering a request Rift could not take (so its id is null)."""
    error: dict[str, Any] = {"code": JSONRPC_INVALID_REQUEST, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


def error_body(error: dict[str, Any], mcp: bool) -> bytes:
    """REST's `{"error": ...}`, or for `/mcp` a JSON-RPC error whose `data` is it."""
    if mcp:
        return jsonrpc_error_body(
            f"{error['code']}: {error['message']}; hint: {error['hint']}", error)
    return json.dumps({"error": error}).encode()


async def send_refusal(send: Send, status: int, error: dict[str, Any], mcp: bool) -> None:
    body = error_body(error, mcp)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if status != 413:  # 413: the body's rest is drained, so that the client reads this
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int | None:
    value = Headers(scope=scope).get("content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


class BodyGuard:
    """Counts a request's body as it arrives: over `max_body` bytes, or not all in
    `body_timeout_s` from the app's first read, the app reads a disconnect and its
    answer is replaced by the refusal (unless it had already started answering)."""

    def __init__(self, app: ASGIApp, max_body: int | Callable[[Scope], int] = MAX_BODY,
                 body_timeout_s: float = 60.0) -> None:
        self.app = app
        self.limit_of: Callable[[Scope], int] = (
            max_body if callable(max_body) else (lambda _scope: max_body))
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        mcp = scope["path"] == "/mcp"
        max_body = self.limit_of(scope)
        declared = _declared_length(scope)
        if declared is not None and declared > max_body:
            await send_refusal(send, 413, too_large(limit=max_body), mcp)
            return
        refused: tuple[int, dict[str, Any]] | None = None
        received = 0
        complete = False
        started = False
        deadline: float | None = None

        async def guarded_receive() -> Message:
            nonlocal refused, received, complete, deadline
            if refused is not None:
                return {"type": "http.disconnect"}
            if complete:
                return await receive()
            if deadline is None:
                deadline = anyio.current_time() + self.body_timeout_s
            message: Message | None = None
            with anyio.move_on_after(deadline - anyio.current_time()):
                message = await receive()
            if message is None:
                refused = (408, too_slow(self.body_timeout_s, received))
                return {"type": "http.disconnect"}
            if message["type"] != "http.request":
                complete = True
                return message
            received += len(message.get("body", b""))
            if received > max_body:
                refused = (413, too_large(limit=max_body))
                return {"type": "http.disconnect"}
            complete = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused is not None and not started:
                return  # the app's answer to the disconnect it read: the refusal replaces it
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            if refused is None or started:
                raise
        if refused is not None and not started:
            await send_refusal(send, refused[0], refused[1], mcp)


def _head_timeout_response(timeout_s: float) -> bytes:
    body = error_body(head_too_slow(timeout_s), mcp=False)
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            + body)


class HeadDeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, and a deadline for each request head (see the module)."""

    head_timeout_s: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._serving():
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._serving():
            self._arm_head_timer()

    def _serving(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._serving():
            return
        pending, _ = self.conn.trailing_data
        if self.conn.their_state is h11.IDLE and pending:
            self.transport.write(_head_timeout_response(self.head_timeout_s))
        self.transport.close()


def guarded_h11(head_timeout_s: float) -> type[HeadDeadlineH11Protocol]:
    """The protocol class for `uvicorn.run(http=...)`, with this head deadline."""
    return type("GuardedH11Protocol", (HeadDeadlineH11Protocol,),
                {"head_timeout_s": head_timeout_s})
