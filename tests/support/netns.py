"""Networks beyond the host, for real-guest tests: a network namespace of the
test's own joined to the host by a veth pair, with a server the test runs in it
(a guest reaches only servers the test starts here; never an outside address)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"ip {' '.join(args)}: {done.stderr.strip()} (a network namespace is "
                    "how this test stands for the networks beyond the host)")


@contextmanager
def namespace(tag: str, host_address: str, addresses: list[str],
              routes: tuple[str, ...] = ()) -> Iterator[str]:
    """A namespace `rift-<tag>-<pid>` whose end of the pair has `addresses` (CIDR), the
    host's end `host_address` (CIDR) and host routes to `routes` through the pair;
    yields its name, and removes it all after."""
    ns = f"rift-{tag}-{os.getpid()}"
    short = f"r{tag[:2]}{os.getpid() % 100000}"
    host_end, ns_end = short + "h", short + "n"
    ip("netns", "add", ns)
    try:
        ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        ip("link", "set", ns_end, "netns", ns)
        ip("addr", "add", host_address, "dev", host_end)
        ip("link", "set", host_end, "up")
        for route in routes:
            ip("route", "add", route, "dev", host_end)
        for address in addresses:
            ip("-n", ns, "addr", "add", address, "dev", ns_end)
        ip("-n", ns, "link", "set", ns_end, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield ns
    finally:
        for route in routes:
            subprocess.run(["ip", "route", "del", route], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@contextmanager
def serving(ns: str, script: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """A Python script (`python -c`) run in the namespace until the block ends."""
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", script, *args])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def wait_listening(address: str, port: int) -> None:
    for _ in range(100):
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            threading.Event().wait(0.1)
    pytest.fail(f"the namespace's server did not listen on {address}:{port}")


# A server of a folder's files over HTTP on 8080 and HTTPS on 8443:
# argv root, certificate, key, address.
FILES = """
import http.server, ssl, sys, threading
root, cert, key, address = sys.argv[1:5]
class Files(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=root, **kwargs)
    def log_message(self, *args):
        pass
plain = http.server.ThreadingHTTPServer((address, 8080), Files)
tls = http.server.ThreadingHTTPServer((address, 8443), Files)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
plain.serve_forever()
"""
