"""The relays of an exposure (SPEC §13), between the client's ASGI call and a
channel to the guest's port: one HTTP/1.1 request and its answer (h11) here, or
one WebSocket (`websocket_relay.py`), each streamed both
ways with bounded buffers: a chunk is read only once the one before it was
written. The channel is read from the event loop (its pipe's readiness), never by
a worker thread: a guest that answers slowly or never costs one channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import h11
from starlette.types import Receive, Scope, Send

from rift.api.exposure_headers import (
    DROPPED,
    NO_REFERRER,
    SANDBOX,
    forwarded_headers,
    header,
    plain,
)
from rift.services.ports import PortChannel

log = logging.getLogger("rift.http")

CHUNK = 64 * 1024
MAX_HEAD = 64 * 1024  # a guest's response head larger than this is refused (502)
HEAD_S = 60.0  # for the guest's response head, once the request is sent
SEND_WAIT_S = 0.005  # between tries while the guest's window is full


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
                await plain(self.send, 502 if not isinstance(exc, TimeoutError) else 504,
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
        length = header(scope, b"content-length")
        if length:
            headers.append((b"content-length", length))
        elif header(scope, b"transfer-encoding"):
            headers.append((b"transfer-encoding", b"chunked"))
        headers.append((b"connection", b"close"))
        return h11.Request(method=scope["method"], target=self.target, headers=headers)

    async def _upload(self) -> None:
        await send_all(self.chan, self.h11.send(self._request()) or b"")
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            if body:
                await send_all(self.chan, self.h11.send(h11.Data(data=body)) or b"")
            if not message.get("more_body", False):
                break
        await send_all(self.chan, self.h11.send(h11.EndOfMessage()) or b"")

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
            data = await recv(self.chan, CHUNK)
            self.h11.receive_data(data)  # b"": the guest closed

    def _response_headers(self, head: h11.Response) -> list[tuple[bytes, bytes]]:
        dropped = (DROPPED - {b"content-length", b"host"}) | {b"referrer-policy"}
        headers = [(bytes(k), bytes(v)) for k, v in head.headers if k not in dropped]
        if self.own_origin:
            headers = [(k, v) for k, v in headers
                       if k not in (b"set-cookie", b"content-security-policy")]
            headers.append((b"content-security-policy", SANDBOX))
        headers.append(NO_REFERRER)
        return headers


async def recv(chan: PortChannel, size: int) -> bytes:
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


async def send_all(chan: PortChannel, data: bytes) -> None:
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
