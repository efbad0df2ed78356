"""The doors' first check (SPEC §15, from clients): who calls, before any byte of
the body is read, and how large a body each route may have.

- `TokenGate` (pure ASGI, outside `BodyGuard`): a request to a door that needs a
  token (`/api/…`, `/mcp`, `/metrics`) has its `Authorization: Bearer` checked
  first; without a valid one it is answered 401 at once, its body never read
  (REST's `{"error": {"code": "unauthorized", …}}`, `/mcp` the SDK's own 401).
  A token of the wrong form costs no thread and no query. The caller found is
  kept in the request's state, so the route does not look it up again. A form
  post that needs a session (`POST /logout`) without a live one is sent to the
  login the same way, unread.
- A door with credentials of its own (the E2B door's `X-API-Key` and access
  token) gives the gate its first check for its path prefix (rift.e2b.gate).
- `body_limit`: what `BodyGuard` lets through, per route. Plain JSON is at most
  `JSON_BODY` (64 KiB); the routes that carry file content, exec stdin or exec
  input, and `/mcp` (whose tool calls carry the same), keep `MAX_BODY` (16 MiB of
  content, base64-encoded and JSON-escaped); the login and logout forms
  `FORM_BODY`.
- `OffLoopRoute`: REST's routes parse a JSON body over `JSON_BODY` in a worker
  thread (40 MiB of escaped JSON is about 0.1 s of parsing: not on the event
  loop, where every other call would wait for it; but the parser holds the GIL,
  so a body of millions of small values still stops the loop while it is
  parsed). `/mcp`'s body over 64 KiB is parsed in a process of its own and
  refused past 100,000 JSON values (rift.api.parsing).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import anyio
from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from rift.api.guard import MAX_BODY, too_many_values
from rift.api.parsing import MAX_VALUES, TooManyValues, parse_body
from rift.api.state import AppState
from rift.domain.errors import RiftError, Unauthorized
from rift.domain.secrets import Token
from rift.services.access import accounts, sessions

JSON_BODY = 64 * 1024
FORM_BODY = 8 * 1024
# (method, path with `*` for one segment): the routes whose bodies carry content.
LARGE_BODY_ROUTES = (
    ("PUT", ("api", "v1", "vms", "*", "files")),
    ("POST", ("api", "v1", "vms", "*", "exec")),
    ("POST", ("api", "v1", "execs", "*", "input")),
    ("POST", ("api", "v1", "images")),  # a recipe's context (SPEC §19)
    ("POST", ("mcp",)),
)
FORM_ROUTES = frozenset({"/login", "/logout"})
CALLER_KEY = "rift_caller"  # in the request's state (`scope["state"]`)
RECORD_KEY = "rift_token_record"


def _matches(parts: list[str], pattern: tuple[str, ...]) -> bool:
    return len(parts) == len(pattern) and all(
        want in ("*", part) for part, want in zip(parts, pattern, strict=True))


def body_limit(scope: Scope) -> int:
    """The most bytes of body this request's route takes."""
    path: str = scope.get("path", "")
    method: str = scope.get("method", "")
    if path in FORM_ROUTES:
        return FORM_BODY
    parts = path.strip("/").split("/")
    if any(method == m and _matches(parts, pattern) for m, pattern in LARGE_BODY_ROUTES):
        return MAX_BODY
    return JSON_BODY


def needs_token(path: str) -> bool:
    return path.startswith("/api/") or path in ("/mcp", "/metrics")


def bearer_of(scope: Scope) -> str | None:
    header = Headers(scope=scope).get("authorization", "")
    scheme, _, value = header.partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


def _cookie(scope: Scope, name: str) -> str | None:
    for part in Headers(scope=scope).get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def _answer(send: Send, status: int, body: dict[str, Any],
                  headers: list[tuple[bytes, bytes]]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
        *headers]})
    await send({"type": "http.response.body", "body": data})


async def refuse_unauthorized(scope: Scope, send: Send) -> None:
    if scope["path"] == "/mcp":  # the SDK's RequireAuthMiddleware answers so
        await _answer(send, 401, {"error": "invalid_token",
                                  "error_description": "Authentication required"},
                      [(b"www-authenticate", b'Bearer error="invalid_token", '
                                             b'error_description="Authentication required"')])
        return
    await _answer(send, 401, {"error": Unauthorized().to_dict()},
                  [(b"www-authenticate", b'Bearer realm="rift"')])


# A door's own first check: given the request (before its body), None to go on or
# the refusal to answer. Doors with credentials of their own (the E2B door) add one.
FirstCheck = Callable[[AppState, Scope], Awaitable[Response | None]]


class TokenGate:
    def __init__(self, app: ASGIApp, state: AppState,
                 doors: Mapping[str, FirstCheck] | None = None) -> None:
        self.app = app
        self.state = state
        self.doors = dict(doors or {})  # path prefix: its first check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        door = next((check for prefix, check in self.doors.items()
                     if path.startswith(prefix + "/")), None)
        if door is not None:
            refused = await door(self.state, scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        elif needs_token(path):
            try:
                found = await self._caller(bearer_of(scope))
            except RiftError as err:  # the database does not answer: 503, as routes say
                await _answer(send, err.status, {"error": err.to_dict()}, [])
                return
            if found is None:
                await refuse_unauthorized(scope, send)
                return
            store = scope.setdefault("state", {})
            store[RECORD_KEY], store[CALLER_KEY] = found
        elif path == "/logout" and scope["method"] == "POST" and not await self._session(scope):
            await send({"type": "http.response.start", "status": 303, "headers": [
                (b"location", b"/login"), (b"cache-control", b"no-store"),
                (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)

    async def _caller(self, token: str | None) -> Any:
        if token is None or not Token.looks_valid(token):
            return None  # no thread, no query
        try:
            return await anyio.to_thread.run_sync(accounts.authenticate, self.state.deps, token)
        except Unauthorized:
            return None

    async def _session(self, scope: Scope) -> bool:
        session_id = _cookie(scope, sessions.SESSION_COOKIE)
        if not session_id:
            return False
        user = await anyio.to_thread.run_sync(sessions.session_user, self.state.deps,
                                              session_id)
        return user is not None


class BodyRefused(HTTPException):
    """A body refused while it was read (an HTTPException, which FastAPI lets through
    its body parsing), answered as `error` (rift.api.errors)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(status, error["message"])
        self.error = error


class OffLoopRequest(Request):
    """A request whose JSON body over JSON_BODY is parsed in the parser process
    (rift.api.parsing), as `/mcp`'s is, and refused past its budget of values."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) <= JSON_BODY:
                self._json = json.loads(body)
                return self._json
            parsed = await anyio.to_thread.run_sync(parse_body, body, True)
            if isinstance(parsed.error, TooManyValues):
                raise BodyRefused(413, too_many_values(parsed.error.seen, MAX_VALUES))
            if parsed.error is not None:
                raise parsed.error
            self._json = parsed.value
        return self._json


class OffLoopRoute(APIRoute):
    """A FastAPI route that hands its handler an `OffLoopRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(OffLoopRequest(request.scope, request.receive))
        return route
