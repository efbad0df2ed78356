"""The egress proxy (rift.api.egress_proxy) on real loopback sockets: what a guest
with an allowlist gets through, and what it is refused (SPEC §13). Which VM a
connection is of, and which addresses are the host's own, are given by the
test (the real ones are a QEMU process's socket and this host's addresses: the
real-guest test, tests/e2e/test_real_egress.py, meets them)."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rift.api.egress_proxy import (
    EgressProxy,
    domain_holding,
    server_name,
    socket_inode,
    split_host_port,
)
from rift.domain import egress
from rift.domain.model import Vm


def _vm(allow: list[str]) -> Vm:
    return Vm(id="vm_abcdefgh", task_id="task_abcdefgh", owner="alice", name="v", image="tiny",
              status="running", host="local", vcpus=1, memory_mib=256, disk_gib=10,
              created_at=datetime.now(UTC), egress=egress.canonical({"allow": allow}))


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
    vm = _vm(allow) if allow is not None else None
    proxy = EgressProxy(None, 0, vm_of=lambda _port: vm,
                        is_local=(lambda _a: True) if local else (lambda _a: False))
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
        (["localhost"], True, f"GET http://localhost:{port}/ HTTP/1.1\r\n\r\n", "host_local"),
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
        got = _ask(proxy, f"GET http://localhost:{port}/ HTTP/1.1\r\n\r\n".encode())
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
