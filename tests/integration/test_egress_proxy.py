"""The egress proxy (rift.proxy) on real loopback sockets: what a guest
with an allowlist gets through, and what it is refused (SPEC §13). Which VM a
connection is of, and which addresses are the host's own, are given by the
test (the real ones are a QEMU process's socket and this host's addresses: the
real-guest test, tests/e2e/test_real_egress.py, meets them)."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rift.domain import egress
from rift.proxy import tunnel
from rift.proxy.guests import domain_holding, socket_inode
from rift.proxy.heads import split_host_port
from rift.proxy.hello import server_name
from rift.proxy.server import EgressProxy
from rift.services.read.egress import GuestEgress


def _guest(allow: list[str]) -> GuestEgress:
    rules = egress.allowlist(egress.canonical({"allow": allow}))
    assert rules is not None
    return GuestEgress("vm_abcdefgh", rules)


class Upstream:
    """A loopback server that keeps what each connection sent and answers `hello`."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                        data += chunk
                except OSError:
                    pass
                self.received.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.sock.close()


def _proxy(allow: list[str] | None, local: bool = False) -> EgressProxy:
    guest = _guest(allow) if allow is not None else None
    proxy = EgressProxy(0, guest_of=lambda _client, _proxy: guest,
                        is_local=(lambda _a: True) if local else (lambda _a: False),
                        # 127.0.0.2 is what egress `open` refuses too, here
                        denied=lambda a: str(a) == "127.0.0.2")
    assert proxy.start()
    return proxy


def _ask(proxy: EgressProxy, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        conn.sendall(data)
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
        return got


def _hello(name: str) -> bytes:
    """A real TLS ClientHello (the ssl module's) asking for `name`."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_listed_name_is_reached_in_origin_form_with_one_request_per_connection(
        upstream: Upstream) -> None:
    proxy = _proxy(["localhost"])
    try:
        got = _ask(proxy, f"GET http://localhost:{upstream.port}/a?b=1 HTTP/1.1\r\n"
                          f"Host: localhost:{upstream.port}\r\nProxy-Connection: keep-alive\r\n"
                          "Accept: */*\r\n\r\n".encode())
    finally:
        proxy.stop()
    assert got.endswith(b"hello") and got.startswith(b"HTTP/1.1 200"), got
    sent = upstream.received[0]
    assert sent.startswith(b"GET /a?b=1 HTTP/1.1\r\n"), sent
    assert b"Connection: close" in sent and b"proxy-connection" not in sent.lower()
    assert b"accept: */*" in sent.lower()
    assert proxy.refusals.snapshot() == dict.fromkeys(proxy.refusals.counts, 0)


def test_what_is_not_listed_or_disagrees_or_is_the_host_is_refused_and_counted(
        upstream: Upstream) -> None:
    port = upstream.port
    cases = [
        (["localhost"], False, f"GET http://other.test:{port}/ HTTP/1.1\r\n\r\n", "not_listed"),
        (["*.sub.localhost"], False, f"GET http://sub.localhost:{port}/ HTTP/1.1\r\n\r\n",
         "not_listed"),  # a wildcard is the names below, not the name
        (["10.9.0.0/16"], False, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n", "not_listed"),
        (["localhost"], False, f"GET http://localhost:{port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
         "host_mismatch"),
        (["localhost"], True, f"GET http://localhost:{port}/ HTTP/1.1\r\n"
         f"Host: localhost:{port}\r\n\r\n", "host_local"),
        (["localhost"], False, f"GET http://localhost:{port}/ HTTP/1.1\r\n\r\n",
         "host_mismatch"),  # no Host at all
        (["localhost"], False, f"GET http://localhost:{port}/ HTTP/1.1\r\n"
         f"Host: localhost:{port}\r\nHost: evil.test\r\n\r\n", "host_mismatch"),
        (["localhost"], False, f"GET http://localhost:{port}/ HTTP/1.1\r\n"
         f"Host: localhost:{port}\r\nhost : localhost:{port}\r\n\r\n",
         "host_mismatch"),  # the same Host twice is two
        (["127.0.0.0/8"], False, f"GET http://127.0.0.2:{port}/ HTTP/1.1\r\n"
         f"Host: 127.0.0.2:{port}\r\n\r\n", "denied"),
        (["nowhere.invalid"], False, "CONNECT nowhere.invalid:443 HTTP/1.1\r\n\r\n",
         "unresolved"),
        (None, False, f"GET http://localhost:{port}/ HTTP/1.1\r\n\r\n", "unknown_vm"),
        (["localhost"], False, "HELLO\r\n\r\n", "bad_request"),
        (["localhost"], False, f"GET https://localhost:{port}/ HTTP/1.1\r\n\r\n", "bad_request"),
    ]
    for allow, local, request, reason in cases:
        proxy = _proxy(allow, local)
        try:
            got = _ask(proxy, request.encode())
        finally:
            proxy.stop()
        status = b"400" if reason == "bad_request" else b"403"
        assert got.startswith(b"HTTP/1.1 " + status), (request, got)
        assert f"X-Rift-Refused: {reason}".encode() in got, (request, got)
        assert proxy.refusals.snapshot()[reason] == 1, (request, proxy.refusals.snapshot())
    assert upstream.received == []  # nothing reached the server


def test_an_allowed_destination_that_does_not_answer_is_a_bad_gateway_not_a_refusal() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    proxy = _proxy(["localhost"])
    try:
        got = _ask(proxy, f"GET http://localhost:{port}/ HTTP/1.1\r\nHost: localhost:{port}"
                          "\r\n\r\n".encode())
    finally:
        proxy.stop()
    assert got.startswith(b"HTTP/1.1 502 "), got
    assert f"port {port}".encode() in got
    assert sum(proxy.refusals.snapshot().values()) == 0


def test_a_tunnel_carries_tls_whose_server_name_is_its_host_and_no_other() -> None:
    echo = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    seen.append(conn.recv(65536))
                    conn.sendall(b"server-hello")
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    port = echo.getsockname()[1]
    proxy = _proxy(["localhost"])
    try:
        good = _ask(proxy, f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode()
                    + _hello("localhost"))
        bad = _ask(proxy, f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode()
                   + _hello("evil.test"))
        plain = _ask(proxy, f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode()
                     + b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
    finally:
        proxy.stop()
        echo.close()
    assert good == b"HTTP/1.1 200 Connection established\r\n\r\nserver-hello"
    assert bad == plain == b"HTTP/1.1 200 Connection established\r\n\r\n"  # then closed
    assert len(seen) == 1 and server_name(seen[0]) == "localhost"
    assert proxy.refusals.snapshot()["sni_mismatch"] == 2


def test_a_client_hello_names_its_server_and_other_bytes_name_none() -> None:
    assert server_name(_hello("pypi.org")) == "pypi.org"
    assert server_name(_hello("Files.PythonHosted.org")) == "files.pythonhosted.org"
    assert server_name(b"GET / HTTP/1.1\r\n\r\n") is None
    assert server_name(b"\x16\x03\x01\x00") is None
    assert split_host_port("pypi.org:443", 80) == ("pypi.org", 443)
    assert split_host_port("[::1]:8080", 80) == ("::1", 8080)
    assert split_host_port("Example.ORG.", 80) == ("example.org", 80)
    for bad in ("host:0", "host:99999", ":80", "host:x"):
        with pytest.raises(ValueError):
            split_host_port(bad, 80)


def test_the_socket_of_a_connection_and_the_qemu_process_that_holds_it_are_found(
        tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        inode = socket_inode(client.getsockname()[1], server.getsockname()[1])
        assert inode == str(os.fstat(client.fileno()).st_ino)
        assert socket_inode(client.getsockname()[1], 1) is None
    finally:
        for sock in (client, accepted, server):
            sock.close()
    qemu = tmp_path / "4242"
    (qemu / "fd").mkdir(parents=True)
    (qemu / "comm").write_text("qemu-system-x86\n")
    (qemu / "cmdline").write_bytes(b"/usr/bin/qemu-system-x86_64\0-name\0"
                                   b"guest=rift-vm_abcdefgh,debug-threads=on\0-S\0")
    os.symlink("socket:[777]", qemu / "fd" / "12")
    other = tmp_path / "4343"
    (other / "fd").mkdir(parents=True)
    (other / "comm").write_text("python3\n")
    os.symlink("socket:[888]", other / "fd" / "3")
    assert domain_holding("777", tmp_path) == "rift-vm_abcdefgh"
    assert domain_holding("888", tmp_path) is None  # not QEMU's
    assert domain_holding("999", tmp_path) is None


class Echo:
    """A loopback server that keeps the first bytes of each connection and answers
    `server-hello`: the far end of a tunnel."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.seen.append(conn.recv(65536))
                    conn.sendall(b"server-hello")
                except OSError:
                    pass


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    yield server
    server.sock.close()


def _tunnel(proxy: EgressProxy, target: str, pieces: list[bytes], pause_s: float = 0.05
            ) -> bytes:
    """CONNECT `target`, then `pieces` in TCP segments of their own, `pause_s` apart."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        for piece in pieces:
            threading.Event().wait(pause_s)
            with contextlib.suppress(OSError):
                conn.sendall(piece)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                got += chunk
        return got


def _records(message: bytes, sizes: list[int]) -> bytes:
    """A handshake message in TLS records of `sizes` bytes (the last one the rest)."""
    out, at = b"", 0
    for size in [*sizes, len(message)]:
        part = message[at:at + size]
        if part:
            out += b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part
        at += size
    return out


OPENED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def test_a_client_hello_split_across_segments_and_records_is_read_whole_before_it_passes(
        echo: Echo) -> None:
    message = _hello("localhost")[5:]
    target = f"localhost:{echo.port}"
    proxy = _proxy(["localhost"])
    try:
        hello = _hello("localhost")
        segments = _tunnel(proxy, target, [hello[:3], hello[3:20], hello[20:]])
        # the handshake header itself cut across records, the name in the last one
        split = _records(message, [2, 1, 40])
        records = _tunnel(proxy, target, [split[:9], split[9:]])
    finally:
        proxy.stop()
    assert segments == records == OPENED + b"server-hello", (segments, records)
    assert echo.seen == [hello, split]  # every byte of the hello, and nothing was lost
    assert sum(proxy.refusals.snapshot().values()) == 0


def test_a_tunnel_that_shows_no_whole_allowed_client_hello_is_refused_before_upstream(
        echo: Echo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tunnel, "HELLO_TIMEOUT_S", 1.0)
    target = f"localhost:{echo.port}"
    message = _hello("localhost")[5:]
    evil = _hello("evil.test")[5:]
    sni_at = message.index(b"localhost")
    cases: dict[str, tuple[list[bytes], str]] = {
        # the first segment alone looked like a record of its own: the rest never came
        "half then nothing": ([_records(message, [sni_at - 4])[:sni_at + 5]], "bad_hello"),
        "wrong name in its last record": ([_records(evil, [30])], "sni_mismatch"),
        "no name": ([_records(_hello_without_name(), [])], "sni_mismatch"),
        "more after it": ([_records(message + b"\x01\x00\x00\x00", [])], "bad_hello"),
        "length past its end": ([b"\x16\x03\x01\x00\x10" + message[:16]], "bad_hello"),
        "too large": ([b"\x16\x03\x01\x40\x00" + b"\x01\xff\xff\xff" + bytes(16380)] * 3,
                      "bad_hello"),
        "two server names": ([_records(_with_second_sni(message, "evil.test"), [])],
                             "bad_hello"),
        "ssh": ([b"SSH-2.0-OpenSSH_9.2\r\n"], "bad_request"),
        "plain, two Hosts": ([b"GET / HTTP/1.1\r\nHost: localhost\r\nHost: evil.test\r\n\r\n"],
                             "host_mismatch"),
        "plain, no Host": ([b"GET / HTTP/1.0\r\n\r\n"], "host_mismatch"),
        "plain, other Host": ([b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"], "sni_mismatch"),
    }
    for label, (pieces, reason) in cases.items():
        proxy = _proxy(["localhost"])
        try:
            started = time.monotonic()
            got = _tunnel(proxy, target, pieces)
            took = time.monotonic() - started
        finally:
            proxy.stop()
        assert got == OPENED, (label, got)  # then closed: nothing came from upstream
        assert proxy.refusals.snapshot()[reason] == 1, (label, proxy.refusals.snapshot())
        assert took < 5, (label, took)
    assert echo.seen == []  # nothing reached the far end


def test_a_tunnel_to_a_listed_address_takes_tls_naming_none_or_a_listed_name(
        echo: Echo) -> None:
    target = f"127.0.0.1:{echo.port}"
    proxy = _proxy(["127.0.0.0/8", "localhost"])
    try:
        nameless = _tunnel(proxy, target, [_records(_hello_without_name(), [])])
        listed = _tunnel(proxy, target, [_hello("localhost")])
        other = _tunnel(proxy, target, [_hello("evil.test")])
    finally:
        proxy.stop()
    assert nameless == listed == OPENED + b"server-hello", (nameless, listed)
    assert other == OPENED
    assert proxy.refusals.snapshot()["sni_mismatch"] == 1


def _hello_without_name() -> bytes:
    """A ClientHello handshake message with no server_name extension."""
    context = ssl.create_default_context()
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    record = outgoing.read()
    assert server_name(record) is None
    return record[5:]


def _with_second_sni(message: bytes, name: str) -> bytes:
    """`message` with a second server_name extension appended (lengths fixed up)."""
    raw = name.encode()
    entry = b"\x00" + len(raw).to_bytes(2, "big") + raw
    extension = b"\x00\x00" + (len(entry) + 2).to_bytes(2, "big") + \
        len(entry).to_bytes(2, "big") + entry
    at = 4 + 2 + 32
    at += 1 + message[at]
    at += 2 + int.from_bytes(message[at:at + 2], "big")
    at += 1 + message[at]
    size = int.from_bytes(message[at:at + 2], "big") + len(extension)
    body = message[4:at] + size.to_bytes(2, "big") + message[at + 2:] + extension
    return b"\x01" + len(body).to_bytes(3, "big") + body
