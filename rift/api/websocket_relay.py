"""An exposure's WebSocket relay (SPEC §13): the guest's handshake first (h11),
then frames (wsproto, as the client: it masks what it sends), both ways over the
channel to the guest's port with bounded buffers (`relays.py` has the HTTP relay
and the channel's reads and writes).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
from typing import Any

import h11
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from rift.api.exposure_headers import DROPPED, NO_REFERRER, forwarded_headers, refuse
from rift.api.relays import CHUNK, HEAD_S, MAX_HEAD, Stream, recv, send_all

# What a WebSocket handshake to the guest sets itself (beside DROPPED).
_WS_DROPPED = DROPPED | {b"sec-websocket-key", b"sec-websocket-version",
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
            await send_all(self.chan, handshake.send(
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
                handshake.receive_data(await recv(self.chan, CHUNK))
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
                    await send_all(self.chan, ws.send(CloseConnection(
                        code=message.get("code", 1000))))
                return
            if message.get("text") is not None:
                await send_all(self.chan, ws.send(TextMessage(data=message["text"])))
            elif message.get("bytes") is not None:
                await send_all(self.chan, ws.send(BytesMessage(data=message["bytes"])))

    async def _down(self, ws: WsConnection) -> None:
        """The guest's messages to the client (whole: fragments are joined), its
        pings answered, its close passed on."""
        parts: list[Any] = []
        size = 0
        while True:
            data = await recv(self.chan, CHUNK)
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
                    await send_all(self.chan, ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    with contextlib.suppress(Exception):
                        await send_all(self.chan, ws.send(event.response()))
                    await self.send({"type": "websocket.close", "code": event.code,
                                     "reason": event.reason or ""})
                    return
            if not data:  # the guest went without a close frame
                await self.send({"type": "websocket.close", "code": 1011})
                return
