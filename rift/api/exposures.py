"""The exposures' door (SPEC §13): HTTP/1.1 and WebSocket to a guest port, proxied
through the VM's SSH connection (a `direct-tcpip` channel per request or
WebSocket), at `/x/<secret>/…` or at `<secret>.<RIFT_PREVIEW_DOMAIN>`.

An ASGI middleware in front of the app: a request for an exposure never reaches
the API's guards (its body is the guest's business, streamed both ways with
bounded buffers: a chunk is read only once the one before it was written).
The engine decides (`services.exposures.resolve`); an unknown secret, an ended
one and one whose VM is gone all answer the same 404, after the same lookup.
Served under Rift's own origin (`/x/`), a guest's page gets an opaque origin
(`Content-Security-Policy: sandbox`) and its cookies are dropped, so it can read
nothing of Rift's; a preview domain gives each exposure an origin of its own.
Either way the guest never sees the client's `Authorization`, `Cookie` or
`Rift-Handle`, and every answer says `Referrer-Policy: no-referrer` (the URL
holds the exposure's secret).
The channel is read from the event loop (its pipe's readiness), never by a
worker thread: a guest that answers slowly or never costs one channel."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Any

import anyio
import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from rift.api.state import AppState
from rift.domain.errors import GuestUnreachable
from rift.services.context import Deps
from rift.services.lifecycle.exposures import Target, resolve
from rift.services.lifecycle.guest_kinds import reach
from rift.services.ports import PortChannel, PortClosed

log = logging.getLogger("rift.http")

PREFIX = b"/x/"
CHUNK = 64 * 1024
MAX_HEAD = 64 * 1024  # a guest's response head larger than this is refused (502)
OPEN_S = 10.0  # to open the channel to the guest's port
HEAD_S = 60.0  # for the guest's response head, once the request is sent
SEND_WAIT_S = 0.005  # between tries while the guest's window is full
# Hop-by-hop headers (RFC 9110 §7.6.1) and what the proxy sets itself.
_DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
                      b"proxy-authenticate", b"te", b"trailer", b"transfer-encoding",
                      b"upgrade", b"host", b"expect", b"content-length"})
SANDBOX = b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"
# What the client sends for Rift, never for the guest: its API token, its cookies
# (Rift's session; under a preview domain, a parent domain's), a task's handle.
PRIVATE = frozenset({b"authorization", b"cookie", b"rift-handle"})
# Every answer from an exposure: its URL (the secret in it) never leaves in a Referer.
NO_REFERRER = (b"referrer-policy", b"no-referrer")


def match(scope: Scope, preview_domain: str | None) -> tuple[str, bytes, bool] | None:
    """(secret, the guest's request target, under Rift's own origin) of a request for
    an exposure; None for any other request."""
    query = scope.get("query_string", b"")
    if preview_domain:
        host = _header(scope, b"host").decode("latin-1").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        secret, dot, domain = name.partition(".")
        if dot and domain == preview_domain and secret:
            return secret, _target(scope.get("raw_path") or scope["path"].encode(), query), False
    raw = scope.get("raw_path") or scope["path"].encode()
    if not raw.startswith(PREFIX):
        return None
    secret, _slash, rest = raw[len(PREFIX):].partition(b"/")
    return secret.decode("latin-1"), _target(b"/" + rest, query), True


def _target(path: bytes, query: bytes) -> bytes:
    return path + (b"?" + query if query else b"")


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value)
    return b""


class ExposureProxy:
    def __init__(self, app: ASGIApp, state: AppState, preview_domain: str | None) -> None:
        self.app = app
        self.state = state
        self.preview_domain = preview_domain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = (match(scope, self.preview_domain) if scope["type"] in ("http", "websocket")
                 else None)
        if found is None:
            await self.app(scope, receive, send)
            return
        secret, target_path, own_origin = found
        deps = self.state.deps
        target = await anyio.to_thread.run_sync(resolve, deps, secret)
        if target is None:
            await refuse(scope, send, 404, "no such exposure")
            return
        if target.vm.status != "running":
            await refuse(scope, send, 503, f"VM {target.vm.id} is {target.vm.status}: "
                         "rift_vm_resume brings it back")
            return
        try:
            chan = await anyio.to_thread.run_sync(_open, deps, target)
        except PortClosed:
            await refuse(scope, send, 502, f"nothing listens on port {target.port} in the guest")
            return
        except GuestUnreachable as exc:
            await refuse(scope, send, 502, f"the guest does not answer: {exc.message}")
            return
        relay = Relay if scope["type"] == "http" else WebSocketRelay
        try:
            await relay(chan, scope, receive, send, target.port, target_path, own_origin).run()
        finally:
            chan.close()


def _open(deps: Deps, target: Target) -> PortChannel:
    chan = reach(target.vm, deps.guests.files).open_port(target.vm, target.port, OPEN_S)
    chan.setblocking(False)
    return chan


async def refuse(scope: Scope, send: Send, status: int, text: str) -> None:
    """A plain answer: to a WebSocket handshake as an HTTP response where the
    server can send one (ASGI's `websocket.http.response`), else a refusal."""
    if scope["type"] == "http":
        await _plain(send, status, text)
    elif "websocket.http.response" in scope.get("extensions", {}):
        await _plain(send, status, text, "websocket.http.response")
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": text[:120]})


async def _plain(send: Send, status: int, text: str, kind: str = "http.response") -> None:
    body = (text + "\n").encode()
    await send({"type": f"{kind}.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), NO_REFERRER]})
    await send({"type": f"{kind}.body", "body": body})


def forwarded_headers(scope: Scope, port: int, own_origin: bool,
                      dropped: frozenset[bytes] = _DROPPED) -> list[tuple[bytes, bytes]]:
    """The client's headers as the guest gets them: without the hop-by-hop ones and
    without what is Rift's (`Authorization`, `Cookie`, `Rift-Handle`), with
    `Host: localhost:<port>` and the `X-Forwarded-*` of the original request."""
    headers = [(k, v) for k, v in scope["headers"]
               if k.lower() not in dropped and k.lower() not in PRIVATE]
    scheme = str(scope.get("scheme") or "http")
    headers += [(b"host", f"localhost:{port}".encode()),
                (b"x-forwarded-host", _header(scope, b"host")),
                (b"x-forwarded-proto", {"ws": "http", "wss": "https"}.get(scheme, scheme)
                 .encode())]
    client = scope.get("client")
    if client:
        headers.append((b"x-forwarded-for", str(client[0]).encode()))
    return headers


@dataclass
class Stream:
    """What a relay moves between: the guest's channel and the client's ASGI call,
    the guest's `port`, the request `target` there, and whether the request came
    under Rift's own origin (`/x/`)."""

    chan: PortChannel
    scope: Scope
    receive: Receive
    send: Send
    port: int
    target: bytes
    own_origin: bool

    def __post_init__(self) -> None:
        """What a relay sets up beside its fields (the generated __init__ calls it)."""


class Relay(Stream):
    """One request and its answer between the client (ASGI) and the guest (h11 over
    the channel)."""

    def __post_init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self.started = False

    async def run(self) -> None:
        upload = asyncio.ensure_future(self._upload())
        try:
            await self._download()
        except (h11.ProtocolError, OSError, EOFError, TimeoutError) as exc:
            log.info("exposure relay ended", extra={"port": self.port,
                                                    "error": type(exc).__name__})
            if not self.started:
                await _plain(self.send, 502 if not isinstance(exc, TimeoutError) else 504,
                             f"the guest's answer on port {self.port} is not usable HTTP"
                             if not isinstance(exc, TimeoutError)
                             else f"the guest did not answer on port {self.port}")
        finally:
            upload.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await upload

    # -- the request ------------------------------------------------------------------

    def _request(self) -> h11.Request:
        scope = self.scope
        headers = forwarded_headers(scope, self.port, self.own_origin)
        length = _header(scope, b"content-length")
        if length:
            headers.append((b"content-length", length))
        elif _header(scope, b"transfer-encoding"):
            headers.append((b"transfer-encoding", b"chunked"))
        headers.append((b"connection", b"close"))
        return h11.Request(method=scope["method"], target=self.target, headers=headers)

    async def _upload(self) -> None:
        await _send_all(self.chan, self.h11.send(self._request()) or b"")
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            if body:
                await _send_all(self.chan, self.h11.send(h11.Data(data=body)) or b"")
            if not message.get("more_body", False):
                break
        await _send_all(self.chan, self.h11.send(h11.EndOfMessage()) or b"")

    # -- the answer -------------------------------------------------------------------

    async def _download(self) -> None:
        head = await asyncio.wait_for(self._next_head(), HEAD_S)
        await self.send({"type": "http.response.start", "status": head.status_code,
                         "headers": self._response_headers(head)})
        self.started = True
        while True:
            event = await self._next()
            if isinstance(event, h11.Data):
                await self.send({"type": "http.response.body", "body": bytes(event.data),
                                 "more_body": True})
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                await self.send({"type": "http.response.body", "body": b""})
                return

    async def _next_head(self) -> h11.Response:
        while True:
            event = await self._next()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise EOFError("the guest closed before answering")
            # an InformationalResponse (100 Continue): ASGI has no way to pass it on

    async def _next(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await _recv(self.chan, CHUNK)
            self.h11.receive_data(data)  # b"": the guest closed

    def _response_headers(self, head: h11.Response) -> list[tuple[bytes, bytes]]:
        dropped = (_DROPPED - {b"content-length", b"host"}) | {b"referrer-policy"}
        headers = [(bytes(k), bytes(v)) for k, v in head.headers if k not in dropped]
        if self.own_origin:
            headers = [(k, v) for k, v in headers
                       if k not in (b"set-cookie", b"content-security-policy")]
            headers.append((b"content-security-policy", SANDBOX))
        headers.append(NO_REFERRER)
        return headers


# What a WebSocket handshake to the guest sets itself (beside _DROPPED).
_WS_DROPPED = _DROPPED | {b"sec-websocket-key", b"sec-websocket-version",
                          b"sec-websocket-extensions", b"sec-websocket-protocol"}
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE = 16 * 2**20  # a WebSocket message larger than this ends the connection (1009)


class WebSocketRelay(Stream):
    """One WebSocket between the client (ASGI) and the guest: the guest's handshake
    first (h11), then frames (wsproto, as the client: it masks what it sends).
    The client is accepted only once the guest accepted, with its subprotocol."""

    async def run(self) -> None:
        connect = await self.receive()
        if connect["type"] != "websocket.connect":
            return
        key = base64.b64encode(os.urandom(16))
        headers = forwarded_headers(self.scope, self.port, self.own_origin, _WS_DROPPED)
        headers += [(b"connection", b"Upgrade"), (b"upgrade", b"websocket"),
                    (b"sec-websocket-key", key), (b"sec-websocket-version", b"13")]
        wanted = self.scope.get("subprotocols") or []
        if wanted:
            headers.append((b"sec-websocket-protocol", ", ".join(wanted).encode()))
        handshake = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        try:
            await _send_all(self.chan, handshake.send(
                h11.Request(method="GET", target=self.target, headers=headers)) or b"")
            head = await asyncio.wait_for(self._head(handshake), HEAD_S)
        except (h11.ProtocolError, OSError, EOFError, TimeoutError) as exc:
            await refuse(self.scope, self.send, 502,
                         f"the guest did not take a WebSocket on port {self.port} "
                         f"({type(exc).__name__})")
            return
        answer = dict((bytes(k), bytes(v)) for k, v in head.headers)
        accept = base64.b64encode(hashlib.sha1(key + _WS_GUID).digest())  # noqa: S324 (RFC 6455)
        if head.status_code != 101 or answer.get(b"sec-websocket-accept") != accept:
            await refuse(self.scope, self.send, 502,
                         f"the guest's port {self.port} answered HTTP {head.status_code}, "
                         "not a WebSocket")
            return
        protocol = answer.get(b"sec-websocket-protocol", b"").decode("latin-1") or None
        await self.send({"type": "websocket.accept", "subprotocol": protocol,
                         "headers": [NO_REFERRER]})
        ws = WsConnection(ConnectionType.CLIENT)
        leftover = handshake.trailing_data[0]
        if leftover:
            ws.receive_data(leftover)
        up = asyncio.ensure_future(self._up(ws))
        down = asyncio.ensure_future(self._down(ws))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            for task in (up, down):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _head(self, handshake: h11.Connection) -> Any:
        while True:
            event = handshake.next_event()
            if event is h11.NEED_DATA:
                handshake.receive_data(await _recv(self.chan, CHUNK))
                continue
            if isinstance(event, h11.InformationalResponse | h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise EOFError("the guest closed before answering")

    async def _up(self, ws: WsConnection) -> None:
        """The client's messages to the guest; its close closes the guest's side."""
        while True:
            message = await self.receive()
            if message["type"] == "websocket.disconnect":
                with contextlib.suppress(Exception):
                    await _send_all(self.chan, ws.send(CloseConnection(
                        code=message.get("code", 1000))))
                return
            if message.get("text") is not None:
                await _send_all(self.chan, ws.send(TextMessage(data=message["text"])))
            elif message.get("bytes") is not None:
                await _send_all(self.chan, ws.send(BytesMessage(data=message["bytes"])))

    async def _down(self, ws: WsConnection) -> None:
        """The guest's messages to the client (whole: fragments are joined), its
        pings answered, its close passed on."""
        parts: list[Any] = []
        size = 0
        while True:
            data = await _recv(self.chan, CHUNK)
            ws.receive_data(data or None)
            for event in ws.events():
                if isinstance(event, TextMessage | BytesMessage):
                    parts.append(event.data)
                    size += len(event.data)
                    if size > MAX_MESSAGE:
                        await self.send({"type": "websocket.close", "code": 1009})
                        return
                    if event.message_finished:
                        joined = "".join(parts) if isinstance(event, TextMessage) \
                            else b"".join(parts)
                        key = "text" if isinstance(event, TextMessage) else "bytes"
                        await self.send({"type": "websocket.send", key: joined})
                        parts, size = [], 0
                elif isinstance(event, Ping):
                    await _send_all(self.chan, ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    with contextlib.suppress(Exception):
                        await _send_all(self.chan, ws.send(event.response()))
                    await self.send({"type": "websocket.close", "code": event.code,
                                     "reason": event.reason or ""})
                    return
            if not data:  # the guest went without a close frame
                await self.send({"type": "websocket.close", "code": 1011})
                return


async def _recv(chan: PortChannel, size: int) -> bytes:
    """What the channel has (b"" at its end), waiting on its pipe for more."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return chan.recv(size)
        except (TimeoutError, BlockingIOError):
            pass
        ready = loop.create_future()
        fd = chan.fileno()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def _send_all(chan: PortChannel, data: bytes) -> None:
    """Write it all, waiting while the guest's window is full (it reads slowly)."""
    view = memoryview(data)
    while view:
        if chan.send_ready():
            try:
                sent = chan.send(bytes(view[:CHUNK]))
            except (TimeoutError, BlockingIOError):
                sent = 0
            if sent == 0 and not chan.send_ready():
                await asyncio.sleep(SEND_WAIT_S)
            view = view[sent:]
        else:
            await asyncio.sleep(SEND_WAIT_S)


def redact(path: str) -> str:
    """A path for the logs: an exposure's secret never appears in them."""
    return "/x/…" if path.startswith("/x/") else path

