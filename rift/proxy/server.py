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
- `CONNECT host:port`: the host must be listed; then what the client sends first
  must be, whole, one of two things (SPEC §15: fail closed), else the tunnel is
  closed before anything goes upstream:
  - a TLS ClientHello (every record of it, however the client split it into
    records and TCP segments, at most HELLO_LIMIT bytes within HELLO_TIMEOUT_S,
    parsed strictly) whose server name (SNI) is the CONNECT host when that is a
    name, and a listed name or none when it is a listed address;
  - a plain HTTP/1 request head with exactly one `Host`, naming the CONNECT host
    (or, to a listed address, a listed host);
- an absolute-form request (`GET http://host/path`): the host must be listed and
  the request carry exactly one `Host`, naming it; it goes upstream in origin
  form with `Connection: close` (one request per connection).
A destination that is the host itself (loopback, link-local, an address of its
own), or that egress `open` refuses too (`denied`: metadata addresses, Rift's
own hosts and database, RIFT_EGRESS_DENY), is refused whatever the list says.
Refusals answer 403 (or close the tunnel, after a CONNECT) and are counted by
reason.
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
TLS_RECORD_LIMIT = 16 * 1024 + 256  # a TLSPlaintext record's body at most (RFC 8446 §5.1)
HELLO_LIMIT = 32 * 1024  # a ClientHello's records, all told
HELLO_TIMEOUT_S = 10.0
REASONS = ("not_listed", "sni_mismatch", "host_mismatch", "host_local", "unresolved",
           "unknown_vm", "bad_request", "bad_hello", "denied")
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

FIREWALL_COUNTERS = {"refused": "host_service", "denied": "egress_deny",
                     "proxied_connect": "connect", "proxied_dns": "dns"}
_FIREWALL_CACHE_S = 2.0
_firewall_seen: dict[str, tuple[float, dict[str, int]]] = {}


def firewall_refusals() -> dict[str, int]:
    """Packets this host's guest firewall refused, by reason: `host_service` (a guest
    at its host's own addresses), `egress_deny` (an `open` guest at the deny sets:
    link-local, metadata, Rift's hosts and database, RIFT_EGRESS_DENY), `connect` and
    `dns` (a proxied guest around its proxy). Empty when the table cannot be read
    (not root, no nft, not loaded)."""
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


class BadHello(ValueError):
    """Bytes that are not one whole, well-formed TLS ClientHello."""


def hello_message(records: bytes) -> bytes:
    """The ClientHello handshake message carried by `records` (TLS handshake records,
    the message possibly split across several); BadHello unless they are exactly
    one whole ClientHello and nothing more, within HELLO_LIMIT."""
    if len(records) > HELLO_LIMIT:
        raise BadHello(f"a ClientHello of more than {HELLO_LIMIT} bytes")
    message, at = b"", 0
    while at < len(records):
        if at + 5 > len(records):
            raise BadHello("a TLS record cut short")
        kind, length = records[at], int.from_bytes(records[at + 3:at + 5], "big")
        if kind != 0x16 or records[at + 1] != 0x03 or not 0 < length <= TLS_RECORD_LIMIT:
            raise BadHello("not a TLS handshake record")
        if at + 5 + length > len(records):
            raise BadHello("a TLS record cut short")
        message += records[at + 5:at + 5 + length]
        at += 5 + length
    if len(message) < 4 or message[0] != 0x01:
        raise BadHello("not a ClientHello")
    if len(message) != 4 + int.from_bytes(message[1:4], "big"):
        raise BadHello("a ClientHello cut short, or with more after it")
    return message


def hello_server_name(message: bytes) -> str | None:
    """The server name (SNI) a ClientHello handshake message asks for, None when it
    names none; BadHello when any length in it disagrees with the others."""

    def take(at: int, size: int) -> tuple[bytes, int]:
        if at + size > len(message):
            raise BadHello("a ClientHello field runs past its end")
        return message[at:at + size], at + size

    def vector(at: int, width: int) -> tuple[bytes, int]:
        size, at = take(at, width)
        return take(at, int.from_bytes(size, "big"))

    at = 4 + 2 + 32  # handshake header, legacy version, random
    session, at = vector(at, 1)
    suites, at = vector(at, 2)
    methods, at = vector(at, 1)
    if len(session) > 32 or not suites or len(suites) % 2 or not methods:
        raise BadHello("a ClientHello's session id, cipher suites or compression is wrong")
    if at == len(message):
        return None  # no extensions at all
    extensions, at = vector(at, 2)
    if at != len(message):
        raise BadHello("bytes after a ClientHello's extensions")
    name, seen, pos = None, set(), 0
    while pos < len(extensions):
        if pos + 4 > len(extensions):
            raise BadHello("an extension cut short")
        kind = int.from_bytes(extensions[pos:pos + 2], "big")
        size = int.from_bytes(extensions[pos + 2:pos + 4], "big")
        body = extensions[pos + 4:pos + 4 + size]
        if len(body) != size or kind in seen:
            raise BadHello("an extension cut short, or twice")
        seen.add(kind)
        pos += 4 + size
        if kind != 0:
            continue
        if len(body) < 2 or int.from_bytes(body[:2], "big") != len(body) - 2:
            raise BadHello("a server_name extension whose list length is wrong")
        entry = body[2:]
        if len(entry) < 3 or entry[0] != 0:
            raise BadHello("a server_name extension without one host_name")
        length = int.from_bytes(entry[1:3], "big")
        if len(entry) != 3 + length or length == 0:
            raise BadHello("a server_name extension with more or less than one host_name")
        raw = entry[3:]
        if not all(0x21 <= byte < 0x7F for byte in raw):
            raise BadHello("a server name that is not printable ASCII")
        name = raw.decode("ascii").lower().rstrip(".")
    return name


def server_name(hello: bytes) -> str | None:
    """The server name (SNI) of a whole TLS ClientHello (its records); None when it
    has none or `hello` is not one, whole."""
    try:
        return hello_server_name(hello_message(hello))
    except BadHello:
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
                 is_local: Callable[[egress_rules.Address], bool] = is_host_local,
                 denied: Callable[[egress_rules.Address], bool] = lambda _address: False
                 ) -> None:
        """`vm_of` (the VM a connection from a client port is of) and `is_local` are
        the host's own by default; tests give their own. `denied`: the addresses egress
        `open` refuses too (rift.services.operator.egress_deny), refused here whatever the list."""
        self.deps = deps
        self.port = port
        self.refusals = Refusals()
        self._vm_of = vm_of or self._vm_of_connection
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
            hosts = [value for name, value in headers if name == b"host"]
            if len(hosts) != 1:
                raise Refused("host_mismatch", f"a request with {len(hosts)} Host headers, "
                              "not one")
            if _host_of(hosts[0], 80) != (host, port):
                raise Refused("host_mismatch", f"Host {hosts[0].decode('ascii', 'replace')} "
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
        first = await _tunnel_opening(reader, host, rules)  # before anything goes upstream
        upstream_reader, upstream = await _connect(addresses, port)
        return upstream_reader, upstream, first

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
        usable = [a for a in usable if not self._denied(a)]
        if not usable:
            raise Refused("denied", f"{host} is where no guest goes (a metadata or link-local "
                          "address, Rift's own hosts or database, or RIFT_EGRESS_DENY)")
        return usable


async def _tunnel_opening(reader: asyncio.StreamReader, host: str,
                          rules: egress_rules.Allowlist) -> bytes:
    """What the client sends first in a tunnel to `host`, when it is a whole ClientHello
    or a plain request head the list allows (see the module's notes); Refused else."""
    first = b""
    try:
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            first = await reader.readexactly(1)
            if first == b"\x16":
                records = first + await reader.readexactly(4)
                while True:
                    length = int.from_bytes(records[-2:], "big")
                    if records[-5] != 0x16 or not 0 < length <= TLS_RECORD_LIMIT:
                        raise BadHello("not a TLS handshake record")
                    if len(records) + length > HELLO_LIMIT:
                        raise BadHello(f"a ClientHello of more than {HELLO_LIMIT} bytes")
                    records += await reader.readexactly(length)
                    if _hello_whole(records):
                        break
                    records += await reader.readexactly(5)
                _check_name(hello_server_name(hello_message(records)), host, rules,
                            tls=True)
                return records
            head = first + await reader.readuntil(b"\r\n\r\n")
    except BadHello as bad:
        raise Refused("bad_hello", f"the tunnel to {host} did not open with one whole "
                      f"ClientHello: {bad}") from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        # cut short, too long or too slow: a ClientHello (bad_hello) or anything else
        raise Refused("bad_hello" if first == b"\x16" else "bad_request",
                      f"the tunnel to {host} did not open with a whole ClientHello or "
                      f"request head within {HELLO_TIMEOUT_S:.0f} s") from None
    try:
        request, headers = _headers(head)
    except Refused:
        request, headers = [], []
    if len(request) != 3 or not request[2].startswith(b"HTTP/1."):
        raise Refused("bad_request", f"the tunnel to {host} opened with neither a TLS "
                      "ClientHello nor an HTTP request")
    hosts = [value for name, value in headers if name == b"host"]
    if len(hosts) != 1:
        raise Refused("host_mismatch", f"a request with {len(hosts)} Host headers, not one")
    named = _host_of(hosts[0], 80)
    _check_name(named[0] if named else "", host, rules, tls=False)
    return head


def _check_name(said: str | None, host: str, rules: egress_rules.Allowlist, tls: bool) -> None:
    """Refused unless the name a tunnel's first bytes ask for (a ClientHello's SNI,
    None for none; a request's Host) is the CONNECT's `host`, or, when that is an
    address, none (TLS only) or one the list allows."""
    if egress_rules.address_of(host) is None:
        right = said == host
    else:
        right = (said is None and tls) or (bool(said) and rules.allows(str(said)))
    if not right:
        raise Refused("sni_mismatch", f"the tunnel to {host} asked for {said or 'no name'}")


def _hello_whole(records: bytes) -> bool:
    """Whether whole TLS records `records` carry as much as their handshake message
    says it holds (its length is in its first 4 bytes, which may span records)."""
    message, at = b"", 0
    while at + 5 <= len(records):
        size = int.from_bytes(records[at + 3:at + 5], "big")
        message += records[at + 5:at + 5 + size]
        at += 5 + size
    return len(message) >= 4 and len(message) >= 4 + int.from_bytes(message[1:4], "big")


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
