"""The egress proxy (SPEC §13): what a guest with an egress allowlist reaches the
networks through, over HTTP and HTTPS.

Such a guest's QEMU runs in the group rift-proxied, and the host's firewall
(hypervisor/guest_isolation.nft) refuses every connection of that group's but
the one to this proxy on the host's loopback (which the guest names as
10.0.2.2:<port>, in its http_proxy and https_proxy). So the guest reaches no
address directly and no DNS server (raw connects and DNS are refused and
counted by the firewall); the proxy resolves the names it allows itself.

Which VM a connection comes from is read off the host, not taken from the
guest: the kernel's socket table (/proc/net/tcp) gives the socket at the other
end of the connection, and the QEMU process holding it names its domain
(`-name guest=rift-<vm id>`). A connection no running proxied VM owns is refused.

Per connection, one of:
- `CONNECT host:port`: the host must be listed; then the first bytes the client
  sends are checked: a TLS ClientHello's server name (SNI), or a plain HTTP
  request's Host, must be the CONNECT host when that is a name;
- an absolute-form request (`GET http://host/path`): the host must be listed and
  agree with the Host header; it goes upstream in origin form with
  `Connection: close` (one request per connection).
A destination that is the host itself (loopback, link-local, an address of its
own) is refused whatever the list says. Refusals answer 403 (or close the
tunnel, after a CONNECT) and are counted by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from rift.domain import egress as egress_rules
from rift.domain.model import Vm
from rift.services.context import Deps

log = logging.getLogger("rift.egress")

HEAD_LIMIT = 16 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
CHUNK = 64 * 1024
TLS_RECORD_LIMIT = 16 * 1024 + 5
REASONS = ("not_listed", "sni_mismatch", "host_mismatch", "host_local", "unresolved",
           "unknown_vm", "bad_request")
# Request headers a proxy consumes (RFC 9110 §7.6.1): never sent upstream.
_HOP_HEADERS = frozenset({b"connection", b"proxy-connection", b"keep-alive",
                          b"proxy-authorization", b"te", b"trailer", b"upgrade"})


class Refusals:
    """Refused proxy requests by reason; read by /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(REASONS, 0)

    def add(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


class Unreachable(Exception):
    """An allowed destination that did not answer (502, not a refusal)."""


class Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# what the firewall refused (hypervisor/guest_isolation.nft's named counters)

FIREWALL_COUNTERS = {"refused": "host_service", "proxied_connect": "connect",
                     "proxied_dns": "dns"}
_FIREWALL_CACHE_S = 2.0
_firewall_seen: dict[str, tuple[float, dict[str, int]]] = {}


def firewall_refusals() -> dict[str, int]:
    """Packets this host's guest firewall refused, by reason: `host_service` (a guest
    at its host's own addresses), `connect` and `dns` (a proxied guest around its
    proxy). Empty when the table cannot be read (not root, no nft, not loaded)."""
    at, seen = _firewall_seen.get("", (0.0, {}))
    if time.monotonic() - at < _FIREWALL_CACHE_S:
        return seen
    nft = shutil.which("nft")
    try:
        if nft is None:
            raise OSError("no nft")
        done = subprocess.run([nft, "-j", "list", "counters", "table", "inet", "rift_guests"],  # noqa: S603 (fixed arguments)
                              capture_output=True, text=True, timeout=5, check=False)
        listed = json.loads(done.stdout) if done.returncode == 0 else {"nftables": []}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        listed = {"nftables": []}
    seen = {}
    for item in listed.get("nftables", []):
        counter = item.get("counter") if isinstance(item, dict) else None
        if isinstance(counter, dict) and counter.get("name") in FIREWALL_COUNTERS:
            seen[FIREWALL_COUNTERS[counter["name"]]] = int(counter.get("packets", 0))
    _firewall_seen[""] = (time.monotonic(), seen)
    return seen


# which VM a connection is from


def _hex_endpoint(port: int) -> str:
    return f"0100007F:{port:04X}"  # 127.0.0.1 as /proc/net/tcp spells it


def socket_inode(client_port: int, server_port: int, table: Path = Path("/proc/net/tcp")
                 ) -> str | None:
    """The inode of the socket 127.0.0.1:client_port connected to 127.0.0.1:server_port."""
    local, remote = _hex_endpoint(client_port), _hex_endpoint(server_port)
    with contextlib.suppress(OSError):
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                return fields[9]
    return None


def domain_holding(inode: str, proc: Path = Path("/proc")) -> str | None:
    """The libvirt domain name of the QEMU process that holds socket `inode`."""
    target = f"socket:[{inode}]"
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "comm").read_text().startswith("qemu-system"):
                continue
            fds = list((entry / "fd").iterdir())
            if not any(_readlink(fd) == target for fd in fds):
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # the process ended meanwhile
        for flag, value in itertools.pairwise(args):
            if flag == b"-name":
                for part in value.decode("utf-8", "replace").split(","):
                    if part.startswith("guest="):
                        return part[len("guest="):]
                return value.decode("utf-8", "replace").split(",")[0]
    return None


def _readlink(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


# what may be reached


def is_host_local(address: egress_rules.Address) -> bool:
    """Whether `address` is this host itself (or no host at all): never a destination."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if (address.is_loopback or address.is_link_local or address.is_unspecified
            or address.is_multicast):
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))  # only an address of this host's binds
        except OSError:
            return False
    return True


def server_name(hello: bytes) -> str | None:
    """The server name (SNI) of a TLS ClientHello record; None when it has none or
    `hello` is not one."""
    try:
        if hello[0] != 0x16 or hello[5] != 0x01:
            return None
        at = 5 + 4 + 2 + 32  # record header, handshake header, version, random
        at += 1 + hello[at]  # session id
        at += 2 + int.from_bytes(hello[at:at + 2], "big")  # cipher suites
        at += 1 + hello[at]  # compression methods
        end = at + 2 + int.from_bytes(hello[at:at + 2], "big")
        at += 2
        while at + 4 <= end:
            kind = int.from_bytes(hello[at:at + 2], "big")
            size = int.from_bytes(hello[at + 2:at + 4], "big")
            body = hello[at + 4:at + 4 + size]
            if kind == 0 and len(body) >= 5 and body[2] == 0:
                length = int.from_bytes(body[3:5], "big")
                return body[5:5 + length].decode("ascii").lower().rstrip(".")
            at += 4 + size
    except (IndexError, UnicodeDecodeError):
        return None
    return None


def split_host_port(text: str, default_port: int) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or a bare host; ValueError when the port is no port."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    port = int(port_text) if port_text else default_port
    if not host or not 1 <= port <= 65535:
        raise ValueError(text)
    return host.lower().rstrip("."), port


def _headers(head: bytes) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon:
            raise Refused("bad_request", "a header line without a colon")
        headers.append((name.strip().lower(), value.strip()))
    return lines[0].split(b" "), headers


class EgressProxy:
    """Serves proxied guests on 127.0.0.1:`port` of this host, in an event loop of its
    own (a thread), so a slow upstream never holds one of the app's workers."""

    def __init__(self, deps: Deps | None, port: int,
                 vm_of: Callable[[int], Vm | None] | None = None,
                 is_local: Callable[[egress_rules.Address], bool] = is_host_local) -> None:
        """`vm_of` (the VM a connection from a client port is of) and `is_local` are
        the host's own by default; tests give their own."""
        self.deps = deps
        self.port = port
        self.refusals = Refusals()
        self._vm_of = vm_of or self._vm_of_connection
        self._is_local = is_local
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

    # which VM

    def _vm_of_connection(self, client_port: int) -> Vm | None:
        inode = socket_inode(client_port, self.port)
        name = domain_holding(inode) if inode is not None else None
        if name is None or not name.startswith("rift-") or self.deps is None:
            return None
        with self.deps.store.read() as tx:
            vm = tx.vms.get(name[len("rift-"):])
        if vm is None or vm.status != "running" or not egress_rules.proxied(vm.egress):
            return None
        return vm

    # one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                async with asyncio.timeout(HEAD_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError):
                raise Refused("bad_request", "no request head (of at most 16 KiB)") from None
            peer = writer.get_extra_info("peername")
            vm = await asyncio.to_thread(self._vm_of, int(peer[1]))
            if vm is None:
                raise Refused("unknown_vm", "this connection is from no VM with an allowlist")
            rules = egress_rules.allowlist(vm.egress)
            assert rules is not None
            upstream_reader, upstream, first = await self._open(head, reader, writer, rules,
                                                                vm)
            upstream.write(first)
            # Done when the upstream is: a client that keeps its end open holds nothing.
            sending = asyncio.create_task(_pipe(reader, upstream))
            try:
                await _pipe(upstream_reader, writer)
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
            for end in (writer, upstream):
                if end is not None:
                    end.close()

    async def _open(self, head: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, rules: egress_rules.Allowlist, vm: Vm
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """The upstream connection for the request in `head`, and the bytes to send it first."""
        request, headers = _headers(head)
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
        if not rules.allows(host):
            raise Refused("not_listed", f"{host} is not in {vm.id}'s egress allowlist")
        if not connect:
            named = dict(headers).get(b"host")
            if named is not None and _host_of(named, 80) != (host, port):
                raise Refused("host_mismatch", f"Host {named.decode('ascii', 'replace')} "
                              f"is not {host}")
        addresses = await self._addresses(host, port)
        if not connect:
            upstream_reader, upstream = await _connect(addresses, port)
            path = url.path or "/"
            line = b" ".join([method, (path + (f"?{url.query}" if url.query else "")).encode(),
                              version])
            kept = [f"{n.decode()}: ".encode() + v for n, v in headers if n not in _HOP_HEADERS]
            return upstream_reader, upstream, b"\r\n".join(
                [line, *kept, b"Connection: close", b"", b""])
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        writer.tunnelled = True  # type: ignore[attr-defined]  # no 403 after a 200
        first = await self._first_bytes(reader)
        if egress_rules.address_of(host) is None:  # checked before anything goes upstream
            said = server_name(first) or _plain_host(first)
            if said is not None and said != host:
                raise Refused("sni_mismatch", f"the tunnel to {host} asked for {said}")
        upstream_reader, upstream = await _connect(addresses, port)
        return upstream_reader, upstream, first

    async def _first_bytes(self, reader: asyncio.StreamReader) -> bytes:
        """What the client sends first in a tunnel: a whole TLS record when it is one."""
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            first = await reader.read(CHUNK)
            if first[:1] == b"\x16":
                while len(first) < 5 or len(first) < 5 + int.from_bytes(first[3:5], "big"):
                    if len(first) >= TLS_RECORD_LIMIT:
                        break
                    more = await reader.read(CHUNK)
                    if not more:
                        break
                    first += more
        return first

    async def _addresses(self, host: str, port: int) -> list[egress_rules.Address]:
        """Where `host` is, without this host's own addresses; Refused when that leaves none."""
        literal = egress_rules.address_of(host)
        if literal is not None:
            candidates = [literal]
        else:
            try:
                found = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM)
            except OSError:
                raise Refused("unresolved", f"{host} does not resolve") from None
            candidates = list(dict.fromkeys(ipaddress.ip_address(f[4][0]) for f in found))
        usable = [a for a in candidates if not self._is_local(a)]
        if not usable:
            raise Refused("host_local", f"{host} is this host: no guest reaches its services")
        return usable


async def _connect(addresses: list[egress_rules.Address], port: int
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of `addresses` that answers (by address: no second
    lookup that could answer otherwise)."""
    why = "no address"
    for address in addresses:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(str(address), port, limit=CHUNK)
        except TimeoutError:
            why = f"{address} port {port}: no answer within {CONNECT_TIMEOUT_S:.0f} s"
        except OSError as exc:
            why = f"{address} port {port}: {exc.strerror or exc}"
    raise Unreachable(why)


def _host_of(value: bytes, default_port: int) -> tuple[str, int] | None:
    try:
        return split_host_port(value.decode("ascii"), default_port)
    except (ValueError, UnicodeDecodeError):
        return None


def _plain_host(first: bytes) -> str | None:
    """The Host of a plain HTTP request sent into a tunnel; None when it is not one."""
    head, sep, _ = first.partition(b"\r\n\r\n")
    if not sep or b" HTTP/1." not in head.split(b"\r\n", 1)[0]:
        return None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            found = _host_of(value.strip(), 80)
            return found[0] if found else None
    return None


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until EOF with one chunk in flight (bounded memory), then half-close."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        sink.close()
