"""Exposures' benchmark (issue #15), on qemu:///system with one `tiny` guest (TCG
here) running busybox httpd, against a `rift serve`-style child process (one
uvicorn worker; bench.execs's), side by side with the same guest server reached
over an SSH tunnel made with paramiko (a local port whose connections each go
through a `direct-tcpip` channel of one open connection with the task's key, as
`ssh -L` does):

1. latency of a small GET (1 KiB), one request at a time, a new connection each
   (busybox httpd closes after each answer): p50 and p99 (target: exposure p50
   at most 2x the tunnel's);
2. requests per second with 8 clients at once (target: at least 0.5x the
   tunnel's);
3. a large download (32 MiB): MiB/s.
The two paths alternate in blocks so the machine's drift falls on both.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import paramiko

from bench.common import print_table
from bench.execs import _open_raw, _raw, _tool, against_server
from bench.mcp import _session
from rift.domain.secrets import new_exposure_secret

GUEST_PORT = 8000
SMALL, BIG_MIB = 1024, 32
LATENCY_BLOCKS, LATENCY_PER_BLOCK = 6, 25
RPS_CLIENTS, RPS_REQUESTS = 8, 200
TARGET_P50, TARGET_RPS = 2.0, 0.5
NOT_FOUND_SAMPLES = 200


class Tunnel:
    """A loopback port forwarded to the guest's GUEST_PORT through paramiko channels."""

    def __init__(self, transport: paramiko.Transport) -> None:
        self.transport = transport
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(conn, peer), daemon=True).start()

    def _carry(self, conn: socket.socket, peer: Any) -> None:
        chan = self.transport.open_channel("direct-tcpip", ("127.0.0.1", GUEST_PORT), peer,
                                           timeout=10)

        def up() -> None:
            try:
                while data := conn.recv(1 << 16):
                    chan.sendall(data)
            except OSError:
                pass
            chan.shutdown_write()

        threading.Thread(target=up, daemon=True).start()
        try:
            while data := chan.recv(1 << 16):
                conn.sendall(data)
        except OSError:
            pass
        finally:
            chan.close()
            conn.close()

    def close(self) -> None:
        self.listener.close()


def _get(client: httpx.Client, url: str) -> float:
    started = time.perf_counter()
    answer = client.get(url)
    assert answer.status_code == 200 and len(answer.content) == SMALL, answer
    return time.perf_counter() - started


def _latencies(paths: dict[str, str]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in paths}
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=30, limits=limits) as client:
        for url in paths.values():  # warm both
            for _ in range(5):
                _get(client, url)
        order = list(paths.items())
        for block in range(LATENCY_BLOCKS):
            for name, url in (order if block % 2 == 0 else order[::-1]):
                samples[name] += [_get(client, url) for _ in range(LATENCY_PER_BLOCK)]
    return samples


def _rps(url: str) -> float:
    limits = httpx.Limits(max_connections=RPS_CLIENTS, max_keepalive_connections=0)
    with httpx.Client(timeout=60, limits=limits) as client, \
            ThreadPoolExecutor(max_workers=RPS_CLIENTS) as pool:
        started = time.perf_counter()
        list(pool.map(lambda _i: _get(client, url), range(RPS_REQUESTS)))
        return RPS_REQUESTS / (time.perf_counter() - started)


def _download(url: str) -> float:
    size = 0
    started = time.perf_counter()
    with httpx.stream("GET", url, timeout=120) as answer:
        for part in answer.iter_bytes():
            size += len(part)
    assert size == BIG_MIB << 20, size
    return BIG_MIB / (time.perf_counter() - started)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def _not_found(paths: dict[str, str]) -> None:
    """Both 404, alike, and their latencies side by side (interleaved)."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    bodies: dict[str, set[bytes]] = {name: set() for name in paths}
    with httpx.Client(timeout=30) as client:
        for _ in range(NOT_FOUND_SAMPLES):
            for name, url in paths.items():
                started = time.perf_counter()
                answer = client.get(url)
                samples[name].append(time.perf_counter() - started)
                assert answer.status_code == 404, answer
                bodies[name].add(answer.content)
    assert len({b for seen in bodies.values() for b in seen}) == 1, bodies  # the same answer
    first = statistics.median(next(iter(samples.values())))
    rows = [(name, f"{statistics.median(got) * 1000:.2f}", f"{_pct(got, 0.99):.2f}",
             str(len(got)), f"{statistics.median(got) / first:.2f}x")
            for name, got in samples.items()]
    print_table("404 for an ended secret and for one never minted (the same body)", rows,
                ("secret", "p50 ms", "p99 ms", "samples", "ratio"))


def _measure(exposure: str, tunnel: str) -> None:
    paths = {"exposure (Rift, /x/<secret>/)": exposure, "paramiko SSH tunnel": tunnel}
    lat = _latencies({name: f"{url}small" for name, url in paths.items()})
    rps: dict[str, list[float]] = {name: [] for name in paths}
    down: dict[str, list[float]] = {name: [] for name in paths}
    for block in range(2):
        for name, url in (list(paths.items()) if block == 0 else list(paths.items())[::-1]):
            rps[name].append(_rps(f"{url}small"))
            down[name].append(_download(f"{url}big"))
    names = list(paths)
    p50 = {n: statistics.median(lat[n]) * 1000 for n in names}
    best_rps = {n: statistics.median(rps[n]) for n in names}
    best_down = {n: statistics.median(down[n]) for n in names}
    rows = []
    for n in names:
        rows.append((n, f"{p50[n]:.1f}", f"{_pct(lat[n], 0.99):.1f}", str(len(lat[n])),
                     f"{p50[n] / p50[names[1]]:.2f}x",
                     f"<= {TARGET_P50}x" if n == names[0] else ""))
    print_table("a 1 KiB GET, one at a time (new connection each)", rows,
                ("path", "p50 ms", "p99 ms", "samples", "p50 ratio", "target"))
    rows = [(n, f"{best_rps[n]:.1f}", f"{best_rps[n] / best_rps[names[1]]:.2f}x",
             f">= {TARGET_RPS}x" if n == names[0] else "") for n in names]
    print_table(f"requests per second, {RPS_CLIENTS} clients, {RPS_REQUESTS} requests (median "
                "of 2)", rows, ("path", "req/s", "ratio", "target"))
    rows = [(n, f"{best_down[n]:.1f}", f"{best_down[n] / best_down[names[1]]:.2f}x")
            for n in names]
    print_table(f"a {BIG_MIB} MiB download (median of 2)", rows, ("path", "MiB/s", "ratio"))


async def _run(url: str, token: str, data_dir: Path) -> None:
    async with _session(url, token, "bench-exposures") as s:
        opened = await _tool(s, "rift_task_new", name="bench-exposures")
        handle = opened["handle"]
        vm = (await _tool(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]
        raw = _open_raw(vm["ssh"]["port"], data_dir / "keys" / opened["task"]["id"])
        tunnel = Tunnel(raw)
        try:
            await anyio.to_thread.run_sync(
                _raw, raw, f"mkdir -p /tmp/www && head -c {SMALL} /dev/zero > /tmp/www/small "
                f"&& head -c {BIG_MIB << 20} /dev/zero > /tmp/www/big && "
                f"busybox httpd -p {GUEST_PORT} -h /tmp/www")
            answered = (await _tool(s, "rift_vm_expose", handle=handle, vm_id=vm["id"],
                                    port=GUEST_PORT))["exposure"]["url"]
            exposed = url + urlsplit(answered).path  # this server's own address
            # an ended secret against one never minted: the same 404 in the same time
            other = (await _tool(s, "rift_vm_expose", handle=handle, vm_id=vm["id"],
                                 port=GUEST_PORT + 1))["exposure"]["url"]
            await _tool(s, "rift_vm_unexpose", handle=handle, vm_id=vm["id"],
                        port=GUEST_PORT + 1)
            unknown = url + "/x/" + new_exposure_secret() + "/"  # well formed, never minted
            await anyio.to_thread.run_sync(_not_found, {
                "ended secret": url + urlsplit(other).path, "unknown secret": unknown})
            await anyio.to_thread.run_sync(_measure, exposed,
                                           f"http://127.0.0.1:{tunnel.port}/")
        finally:
            tunnel.close()
            raw.close()
            await _tool(s, "rift_task_close", handle=handle)


def main() -> None:
    against_server("exposures", _run)


if __name__ == "__main__":
    main()
