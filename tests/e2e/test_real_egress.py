"""Egress and the guests' isolation from their host (SPEC §13) on real `tiny`
guests under TCG: a server in a network namespace of the test's own stands for
the networks beyond the host (an `open` guest reaches it, a `none` guest does
not), and servers on this host (on its loopback, which QEMU maps 10.0.2.2 to, on
its own address, and Rift's API itself) are reached by no guest. The firewall
that refuses them is scripts/libvirt.sh's (hypervisor/guest_isolation.nft): a
machine without it fails here, it is not skipped."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.servers import (
    Server,
    free_port,
    real_vms_missing,
    start_real_server,
    stop_server,
)
from tests.support.witnesses import our_domains

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 240
BEYOND = "10.213.0.2"  # the namespace's end of the veth pair; the host's is .1
# busybox's static wget crashes looking names up even for an address; nc does not
FETCH = ("printf 'GET /{path} HTTP/1.0\\r\\n\\r\\n' | nc -w 4 {address} {port} 2>&1 "
         "| tail -n 1; echo exit=$?")


class Says(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.text.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def serve(address: str, port: int, text: str) -> http.server.HTTPServer:
    server = http.server.ThreadingHTTPServer((address, port), Says)
    server.text = text  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"ip {' '.join(args)}: {done.stderr.strip()} (a network namespace is "
                    "how this test stands for the networks beyond the host)")


@pytest.fixture(scope="module")
def beyond() -> Iterator[str]:
    """A web server in a network namespace of its own, reached over a veth pair:
    answers `beyond` at BEYOND:8080."""
    ns = f"rift-egress-{os.getpid()}"
    host_end, ns_end = f"rfe{os.getpid() % 100000}h", f"rfe{os.getpid() % 100000}n"
    _ip("netns", "add", ns)
    proc = None
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        _ip("link", "set", ns_end, "netns", ns)
        _ip("addr", "add", "10.213.0.1/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", ns, "addr", "add", f"{BEYOND}/30", "dev", ns_end)
        _ip("-n", ns, "link", "set", ns_end, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        code = ("import http.server as h\n"
                "class S(h.BaseHTTPRequestHandler):\n"
                "    def do_GET(self):\n"
                "        self.send_response(200); self.send_header('Content-Length', '6')\n"
                "        self.end_headers(); self.wfile.write(b'beyond')\n"
                f"h.HTTPServer(('{BEYOND}', 8080), S).serve_forever()\n")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", code])
        for _ in range(100):
            try:
                with socket.create_connection((BEYOND, 8080), timeout=1):
                    break
            except OSError:
                threading.Event().wait(0.1)
        else:
            pytest.fail("the namespace's server did not listen")
        yield f"{BEYOND}:8080"
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _host_address() -> str:
    """This host's own first non-loopback IPv4 address."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True, check=True).stdout
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines()
                 if not line.split()[1].startswith("rfe")]
    assert addresses, out
    return addresses[0]


def _refused() -> int:
    """Packets the guests' isolation has refused (its nft counter)."""
    listed = subprocess.run(["nft", "-j", "list", "counter", "inet", "rift_guests", "refused"],
                            capture_output=True, text=True, check=True).stdout
    found = [item["counter"] for item in json.loads(listed)["nftables"] if "counter" in item]
    return int(found[0]["packets"])


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    isolation = subprocess.run(["nft", "list", "table", "inet", "rift_guests"],
                               capture_output=True, text=True, check=False)
    assert isolation.returncode == 0, (
        "the guests' isolation is not loaded (scripts/libvirt.sh loads it): "
        + isolation.stderr.strip())
    proc, srv = start_real_server(tmp_path_factory.mktemp("egress"),
                                  RIFT_VM_BOOT_TIMEOUT_S="90")
    try:
        yield srv
    finally:
        stop_server(proc)
        remaining = our_domains(srv)
        assert not remaining, f"domains left behind: {sorted(remaining)}"


def test_an_open_guest_reaches_beyond_its_host_a_none_guest_nothing_and_neither_the_host(
        real: Server, beyond: str, tmp_path: Path) -> None:
    loopback_port, own_port = free_port(), free_port()
    on_loopback = serve("127.0.0.1", loopback_port, "host loopback")
    on_own = serve("0.0.0.0", own_port, "host address")  # noqa: S104 (the test's own server)
    rift_port = int(real.url.rsplit(":", 1)[1])
    refused_before = _refused()
    host = _host_address()
    seen: dict[str, dict[str, str]] = {}

    async def scenario() -> None:
        async with mcp_session(real.url, real.token) as s:
            handle = (await call(s, "rift_task_new", name="egress"))["handle"]
            err = await refused(s, "invalid_argument", "rift_vm_new", handle=handle,
                                image="tiny", egress="sometimes")
            assert "egress" in json.dumps(err), err
            for egress in ("open", "none"):
                vm = (await call(s, "rift_vm_new", handle=handle, image="tiny",
                                 egress=egress))["vm"]
                assert vm["egress"] == egress and vm["status"] == "running", vm
                targets = {"beyond": (BEYOND, 8080, ""),
                           "loopback": ("10.0.2.2", loopback_port, ""),
                           "rift": ("10.0.2.2", rift_port, "healthz"),
                           "own address": (host, own_port, "")}
                seen[egress] = {}
                for label, (address, port, path) in targets.items():
                    command = FETCH.format(address=address, port=port, path=path)
                    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                      command=command, timeout_s=30, wait_s=30)
                    seen[egress][label] = done["stdout"]
                await call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
            await call(s, "rift_task_close", handle=handle)

    try:
        run(scenario, LIMIT_S)
    finally:
        for server in (on_loopback, on_own):
            server.shutdown()
            server.server_close()
    print(f"\nwhat each guest's nc got: {seen}")
    assert seen["open"]["beyond"].startswith("beyond"), seen
    assert "beyond" not in seen["none"]["beyond"], seen
    for egress in ("open", "none"):
        for label in ("loopback", "rift", "own address"):
            out = seen[egress][label]
            assert "host loopback" not in out and "host address" not in out, (egress, label, out)
            assert '"status"' not in out and "refused" in out, (egress, label, out)
    # refused by the firewall (its counter), not missed: the servers were there
    assert _refused() - refused_before >= 3
