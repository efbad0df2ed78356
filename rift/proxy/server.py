"""The egress proxy's listener (SPEC §13): one connection after another, each
refused (and counted by reason) or forwarded.

Per connection, one of:
- `CONNECT host:port`: the host must be listed; then what the client sends first
  must be, whole, a TLS ClientHello or a plain HTTP/1 request head that agrees with
  the CONNECT host (rift.proxy.tunnel), else the tunnel is closed before anything
  goes upstream;
- an absolute-form request (`GET http://host/path`): the host must be listed and
  the request carry exactly one `Host`, naming it; it goes upstream in origin
  form with `Connection: close` (one request per connection).
A destination that is the host itself, or that egress `open` refuses too, is
refused whatever the list says (rift.proxy.upstream). Refusals answer 403 (or
close the tunnel, after a CONNECT).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from rift.domain import egress
from rift.proxy import upstream
from rift.proxy.heads import HOP_HEADERS, host_of, hosts_in, parse_head, split_host_port
from rift.proxy.refusals import Refusals, Refused, Unreachable
from rift.proxy.tunnel import tunnel_opening
from rift.services.read.egress import GuestEgress

log = logging.getLogger("rift.egress")

HEAD_LIMIT = 16 * 1024
HEAD_TIMEOUT_S = 30.0
# The proxied guest a connection comes from: given its client port and the proxy's.
GuestOf = Callable[[int, int], GuestEgress | None]


class EgressProxy:
    """Serves proxied guests on 127.0.0.1:`port` of this host, in an event loop of its
    own (a thread), so a slow upstream never holds one of the app's workers."""

    def __init__(self, port: int, guest_of: GuestOf,
                 is_local: Callable[[egress.Address], bool] = upstream.is_host_local,
                 denied: Callable[[egress.Address], bool] = lambda _address: False
                 ) -> None:
        """`guest_of`: which VM a connection is from, and its rules (on a real host,
        rift.proxy.guests.GuestsOnThisHost); `is_local` is the host's own by default;
        tests give their own. `denied`: the addresses egress `open` refuses too
        (rift.guest.egress_deny), refused here whatever the list."""
        self.port = port
        self.refusals = Refusals()
        self._guest_of = guest_of
        self._is_local = is_local
        self._denied = denied
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> bool:
        """Listen; False (and a log line) when the port is taken or cannot be bound."""
        loop = asyncio.new_event_loop()
        try:
            self._server = loop.run_until_complete(asyncio.start_server(
                self._serve, "127.0.0.1", self.port, limit=HEAD_LIMIT, reuse_address=True))
        except OSError as exc:
            loop.close()
            if exc.errno == errno.EADDRINUSE:  # another replica on this machine serves it
                log.warning("the egress proxy's port 127.0.0.1:%s is taken (another Rift "
                            "on this machine serves it, or something else does)", self.port)
            else:
                log.error("the egress proxy cannot listen on 127.0.0.1:%s (%s): guests with "
                          "an egress allowlist reach nothing from this host", self.port, exc)
            return False
        self.port = self._server.sockets[0].getsockname()[1]
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="rift-egress-proxy",
                                        daemon=True)
        self._thread.start()
        log.info("egress proxy on 127.0.0.1:%s", self.port)
        return True

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        loop.close()
        self._loop = None

    # one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sink: asyncio.StreamWriter | None = None
        try:
            try:
                async with asyncio.timeout(HEAD_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError):
                raise Refused("bad_request", "no request head (of at most 16 KiB)") from None
            peer = writer.get_extra_info("peername")
            guest = await asyncio.to_thread(self._guest_of, int(peer[1]), self.port)
            if guest is None:
                raise Refused("unknown_vm", "this connection is from no VM with an allowlist")
            source, sink, first = await self._open(head, reader, writer, guest)
            sink.write(first)
            # Done when the upstream is: a client that keeps its end open holds nothing.
            sending = asyncio.create_task(upstream.pipe(reader, sink))
            try:
                await upstream.pipe(source, writer)
            finally:
                sending.cancel()
        except Refused as refused:
            self.refusals.add(refused.reason)
            log.info("egress refused", extra={"reason": refused.reason,
                                              "detail": str(refused)})
            if not writer.is_closing() and not getattr(writer, "tunnelled", False):
                body = f"rift egress: {refused}\n".encode()
                status = (b"400 Bad Request" if refused.reason == "bad_request"
                          else b"403 Forbidden")
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\n"
                             b"X-Rift-Refused: " + refused.reason.encode() +
                             b"\r\nConnection: close\r\nContent-Length: " +
                             str(len(body)).encode() + b"\r\n\r\n" + body)
        except Unreachable as exc:
            if not writer.is_closing() and not getattr(writer, "tunnelled", False):
                body = f"rift egress: {exc}\n".encode()
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in (writer, sink):
                if end is not None:
                    end.close()

    async def _open(self, head: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, guest: GuestEgress
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """The upstream connection for the request in `head`, and the bytes to send it first."""
        request, headers = parse_head(head)
        if len(request) != 3:
            raise Refused("bad_request", "not an HTTP request line")
        method, target, version = request
        connect = method == b"CONNECT"
        try:
            if connect:
                host, port = split_host_port(target.decode("ascii"), 443)
            else:
                url = urlsplit(target.decode("ascii"))
                if url.scheme != "http" or not url.netloc:
                    raise ValueError(target)
                host, port = split_host_port(url.netloc, 80)
        except (ValueError, UnicodeDecodeError):
            raise Refused("bad_request", "a proxy request names http://host/… or CONNECT "
                          "host:port") from None
        if not guest.rules.allows(host):
            raise Refused("not_listed", f"{host} is not in {guest.vm_id}'s egress allowlist")
        if not connect:
            hosts = hosts_in(headers)
            if len(hosts) != 1:
                raise Refused("host_mismatch", f"a request with {len(hosts)} Host headers, "
                              "not one")
            if host_of(hosts[0], 80) != (host, port):
                raise Refused("host_mismatch", f"Host {hosts[0].decode('ascii', 'replace')} "
                              f"is not {host}")
        found = await upstream.addresses(host, port, self._is_local, self._denied)
        if not connect:
            source, sink = await upstream.connect(found, port)
            path = url.path or "/"
            line = b" ".join([method, (path + (f"?{url.query}" if url.query else "")).encode(),
                              version])
            kept = [f"{n.decode()}: ".encode() + v for n, v in headers if n not in HOP_HEADERS]
            return source, sink, b"\r\n".join([line, *kept, b"Connection: close", b"", b""])
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        writer.tunnelled = True  # type: ignore[attr-defined]  # no 403 after a 200
        first = await tunnel_opening(reader, host, guest.rules)  # before anything goes upstream
        source, sink = await upstream.connect(found, port)
        return source, sink, first
