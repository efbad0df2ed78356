"""A plain HTTP forward proxy for machines the tests make in network namespaces,
which reach nothing but this machine: their apt gets the Debian mirror through
it (`Acquire::http::Proxy`), as a fleet behind a proxy would.

One request per connection, in absolute form (`GET http://host/path HTTP/1.1`),
sent upstream in origin form with `Connection: close` and its answer streamed
back until the upstream closes; CONNECT and anything else are answered 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024


class HttpProxy:
    """Listens on each of `addresses` at one port, in a thread of its own."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.port = 0
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="http-proxy",
                                        daemon=True)

    def start(self) -> HttpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(30)
        return self

    async def _listen(self) -> None:
        for address in self.addresses:
            server = await asyncio.start_server(self._serve, address, self.port)
            self.port = server.sockets[0].getsockname()[1]
            self._servers.append(server)

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
                await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > HEAD_LIMIT:
                return
            request, *lines = head.decode("latin-1").split("\r\n")
            method, target, _version = request.split(" ", 2)
            url = urlsplit(target)
            if method not in ("GET", "HEAD") or url.scheme != "http" or not url.hostname:
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\n")
                return
            kept = [line for line in lines if line and not line.lower().startswith(
                ("connection:", "proxy-connection:", "keep-alive:"))]
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port or 80)
            self.requests += 1
            try:
                up_writer.write((f"{method} {path} HTTP/1.1\r\n" + "\r\n".join(kept)
                                 + "\r\nConnection: close\r\n\r\n").encode("latin-1"))
                await up_writer.drain()
                while chunk := await up_reader.read(1 << 16):
                    writer.write(chunk)
                    await writer.drain()
            finally:
                up_writer.close()
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            with contextlib.suppress(OSError):
                writer.close()
