"""WebSocket in tests, on plain sockets with wsproto: an echo server that plays a
guest's port (it answers each message with `echo: <message>`, in two fragments
for binary ones, pings first when asked), and a blocking client."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)


def _serve_one(conn: socket.socket, seen: list[dict[str, str]] | None = None) -> None:
    ws = WSConnection(ConnectionType.SERVER)
    text: list[str] = []
    blob: list[bytes] = []
    with conn:
        while True:
            data = conn.recv(65536)
            ws.receive_data(data or None)
            for event in ws.events():
                out = b""
                if isinstance(event, Request):
                    if seen is not None:  # the handshake's headers, as the guest got them
                        seen.append({bytes(k).decode().lower(): bytes(v).decode()
                                     for k, v in event.extra_headers})
                    protocol = "chat" if "chat" in event.subprotocols else None
                    out = ws.send(AcceptConnection(subprotocol=protocol))
                elif isinstance(event, TextMessage):
                    text.append(event.data)
                    if event.message_finished:
                        message = "".join(text)
                        text.clear()
                        if message == "ping me":
                            out = ws.send(Ping(payload=b"p"))
                        out += ws.send(TextMessage(data=f"echo: {message}"))
                elif isinstance(event, BytesMessage):
                    blob.append(event.data)
                    if event.message_finished:
                        whole = b"".join(blob)
                        blob.clear()
                        half = len(whole) // 2
                        out = ws.send(BytesMessage(data=whole[:half], message_finished=False))
                        out += ws.send(BytesMessage(data=whole[half:]))
                elif isinstance(event, CloseConnection):
                    conn.sendall(ws.send(event.response()))
                    return
                if out:
                    conn.sendall(out)
            if not data:
                return


@contextmanager
def echo_server(seen: list[dict[str, str]] | None = None) -> Iterator[tuple[str, int]]:
    """The echo server's address; `seen` gets each handshake's other headers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stopped = threading.Event()

    def accept() -> None:
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_serve_one, args=(conn, seen), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield ("127.0.0.1", listener.getsockname()[1])
    finally:
        stopped.set()
        listener.close()


class Client:
    """A blocking WebSocket client: `open` answers the accepted subprotocol, or
    raises with the status of a refused handshake."""

    def __init__(self, address: tuple[str, int], host: str, target: str,
                 subprotocols: list[str] | None = None,
                 extra_headers: list[tuple[str, str]] | None = None) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(
            host=host, target=target, subprotocols=subprotocols or [],
            extra_headers=[(k.encode(), v.encode()) for k, v in extra_headers or []])))
        self.pongs = 0

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def open(self) -> str | None:
        for event in self._events():
            if isinstance(event, AcceptConnection):
                return event.subprotocol
            if isinstance(event, RejectConnection):
                raise ConnectionRefusedError(event.status_code)
        raise ConnectionError("closed during the handshake")

    def send(self, data: str | bytes) -> None:
        event = TextMessage(data=data) if isinstance(data, str) else BytesMessage(data=data)
        self.sock.sendall(self.ws.send(event))

    def receive(self) -> str | bytes:
        parts: list[Any] = []
        for event in self._events():
            if isinstance(event, TextMessage | BytesMessage):
                parts.append(event.data)
                if event.message_finished:
                    return "".join(parts) if isinstance(event, TextMessage) else b"".join(parts)
            elif isinstance(event, Ping):
                self.sock.sendall(self.ws.send(event.response()))
            elif isinstance(event, Pong):
                self.pongs += 1
            elif isinstance(event, CloseConnection):
                raise ConnectionError(f"closed: {event.code}")
        raise ConnectionError("the connection ended")

    def close(self) -> int:
        """Close, and answer the code of the server's close frame."""
        self.sock.sendall(self.ws.send(CloseConnection(code=1000)))
        for event in self._events():
            if isinstance(event, CloseConnection):
                return event.code
        return 1006

    def _events(self) -> Iterator[Any]:
        while True:
            data = self.sock.recv(65536)
            self.ws.receive_data(data or None)
            yield from self.ws.events()
            if not data:
                return
