"""Execs' benchmarks (issue #13), on qemu:///system with one `tiny` guest (TCG
here), against a `rift serve`-style child process (one uvicorn worker), side by
side with raw paramiko on an open connection to the same guest with the task's
own key:

1. round trip of a short command (`true`): `rift_vm_exec` through the official
   SDK client (2026-07-28, one session) against raw paramiko's exec; interleaved
   blocks, medians and the ratio (target: at most 1.5x);
2. latency from a byte written in the guest to the byte seen: a running exec
   echoes each line written to a FIFO; raw paramiko writes one line while a
   `rift_vm_exec_get` long poll waits (or while `GET /execs/{id}/stream` is
   open); from the raw write's start to the answer or event (target: under
   100 ms). The raw write's own exec round trip is in the figure: it is printed
   beside it;
3. output throughput: a 16 MiB file of text `cat` by an exec, read to its end
   with `rift_vm_exec_get` (1 MiB per answer) against raw `cat` over paramiko.

Needs libvirtd on qemu:///system (scripts/libvirt.sh).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import paramiko
from mcp.client.session import ClientSession

from bench.common import print_table, work_dir
from bench.mcp import _session, _start
from rift.guest.keys import load_key
from tests.support.servers import destroy_installation

URI = "qemu:///system"
ROOT = Path(__file__).resolve().parents[1]
# The `tiny` the tests cache (RIFT_TEST_CACHE, as scripts/test.sh sets it), built if missing.
IMAGES = Path(os.environ.get("RIFT_TEST_CACHE") or "/var/cache/rift-tests") / "test-images"
TRIP_BLOCKS, TRIP_CALLS = 8, 10
LATENCY_SAMPLES = 15
BIG_MIB = 16
FIFO = "/tmp/rift-bench-fifo"  # in the guest  # noqa: S108
TARGET_RATIO, TARGET_LATENCY_MS = 1.5, 100.0


# -- the server (child process) -------------------------------------------------------

def serve(port: int, data_dir: Path) -> None:
    from hypervisor.tiny import build_tiny

    serve_real(port, data_dir, {"tiny": build_tiny(IMAGES)}, "tiny")


def serve_real(port: int, data_dir: Path, images: dict[str, Path], default_image: str,
               **settings: Any) -> None:
    """`rift serve` as it builds itself, on qemu:///system and one uvicorn worker,
    with `images` (name -> an image folder) linked into its data dir; prints the
    admin's token first."""
    import uvicorn

    from rift.app import create_app
    from rift.bootstrap import build_deps, close_deps, ensure_admin
    from rift.config import Settings

    folder = data_dir / "images"
    folder.mkdir(parents=True, exist_ok=True)
    for name, image in images.items():
        (folder / name).symlink_to(image, target_is_directory=True)
    config = Settings(data_dir=data_dir, hypervisor_uri=URI, log_level="WARNING",
                      default_image=default_image, **settings)
    deps = build_deps(config)
    first = ensure_admin(deps)
    assert first is not None
    print(first.token, flush=True)
    try:
        uvicorn.run(create_app(config, deps), host="127.0.0.1", port=port,
                    log_level="warning", workers=1)
    finally:
        close_deps(deps)


# -- the raw side ---------------------------------------------------------------------

def _raw(transport: paramiko.Transport, command: str) -> bytes:
    chan = transport.open_session(timeout=10)
    try:
        chan.exec_command(command)
        out = bytearray()
        while chunk := chan.recv(1 << 20):
            out += chunk
        chan.recv_exit_status()
        return bytes(out)
    finally:
        chan.close()


def _open_raw(port: int, key_file: Path) -> paramiko.Transport:
    transport = paramiko.Transport(socket.create_connection(("127.0.0.1", port), timeout=10))
    transport.start_client(timeout=10)
    transport.auth_publickey("root", load_key(key_file))
    return transport


# -- the client -----------------------------------------------------------------------

async def _tool(s: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    result = await s.call_tool(tool, args)
    assert not result.is_error and isinstance(result.structured_content, dict), result
    return result.structured_content


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f}"


async def _round_trip(s: ClientSession, handle: str, vm_id: str,
                      raw: paramiko.Transport) -> list[tuple[str, ...]]:
    rift: list[float] = []
    floor: list[float] = []

    async def rift_once() -> None:
        out = await _tool(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command="true")
        assert out["exit_code"] == 0

    for block in range(TRIP_BLOCKS):
        pair: list[tuple[list[float], Callable[[], Any]]] = [
            (rift, rift_once), (floor, lambda: anyio.to_thread.run_sync(_raw, raw, "true"))]
        for samples, fn in (pair if block % 2 == 0 else pair[::-1]):
            for _ in range(TRIP_CALLS):
                started = time.perf_counter()
                await fn()
                samples.append(time.perf_counter() - started)
    ratio = statistics.median(rift) / statistics.median(floor)
    return [("rift_vm_exec through MCP", _ms(rift), str(len(rift)), f"{ratio:.2f}x",
             f"<= {TARGET_RATIO}x"),
            ("raw paramiko exec, open connection", _ms(floor), str(len(floor)), "1.00x", "")]


async def _latency(s: ClientSession, url: str, token: str, handle: str, vm_id: str,
                   raw: paramiko.Transport) -> list[tuple[str, ...]]:
    await anyio.to_thread.run_sync(_raw, raw, f"rm -f {FIFO}; mkfifo {FIFO}")
    echo = await _tool(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=0,
                       timeout_s=600, command=f"while true; do cat {FIFO}; done")
    offset = 0
    polls: list[float] = []
    writes: list[float] = []
    for i in range(LATENCY_SAMPLES):
        seen: dict[str, Any] = {}

        async def poll(at: int = offset, seen: dict[str, Any] = seen) -> None:
            seen.update(await _tool(s, "rift_vm_exec_get", handle=handle,
                                    exec_id=echo["exec_id"], stdout_offset=at, wait_s=30))
            seen["at"] = time.perf_counter()

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await anyio.sleep(0.3)  # the long poll waits in the guest by now
            started = time.perf_counter()
            await anyio.to_thread.run_sync(_raw, raw, f"echo {i} > {FIFO}")
            writes.append(time.perf_counter() - started)
        assert seen["stdout"] == f"{i}\n", seen
        polls.append(seen["at"] - started)
        offset = seen["stdout_offset"]

    events: list[tuple[float, str]] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", f"{url}/api/v1/execs/{echo['exec_id']}/stream",
                          params={"stdout_offset": offset}, timeout=60, headers={
                              "Authorization": f"Bearer {token}", "Rift-Handle": handle}) as r:
            ready.set()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append((time.perf_counter(), json.loads(line[6:]).get("text", "")))
                    if len(events) >= LATENCY_SAMPLES:
                        return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    ready.wait(30)
    await anyio.sleep(0.5)
    streamed: list[float] = []
    for i in range(LATENCY_SAMPLES):
        before = len(events)
        started = time.perf_counter()
        await anyio.to_thread.run_sync(_raw, raw, f"echo s{i} > {FIFO}")
        while len(events) == before:
            await anyio.sleep(0.001)
        streamed.append(events[before][0] - started)
        await anyio.sleep(0.2)
    listener.join(10)
    await _tool(s, "rift_vm_exec_kill", handle=handle, exec_id=echo["exec_id"], signal="KILL")
    return [("byte -> rift_vm_exec_get long poll", _ms(polls), str(len(polls)),
             f"< {TARGET_LATENCY_MS:.0f} ms"),
            ("byte -> GET /execs/{id}/stream event", _ms(streamed), str(len(streamed)),
             f"< {TARGET_LATENCY_MS:.0f} ms"),
            ("(in both: the raw write's own exec)", _ms(writes), str(len(writes)), "")]


async def _throughput(s: ClientSession, handle: str, vm_id: str,
                      raw: paramiko.Transport) -> list[tuple[str, ...]]:
    size = BIG_MIB << 20
    await anyio.to_thread.run_sync(
        _raw, raw, f"yes abcdefghijklmnopqrstuvwxyz0123456789 | head -c {size} > /tmp/big")
    started = time.perf_counter()
    out = await _tool(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command="cat /tmp/big",
                      wait_s=60)
    got = len(out["stdout"])
    offset = out["stdout_offset"]
    while offset < size:
        more = await _tool(s, "rift_vm_exec_get", handle=handle, exec_id=out["exec_id"],
                           stdout_offset=offset)
        got += len(more["stdout"])
        offset = more["stdout_offset"]
    rift_s = time.perf_counter() - started
    assert got == size, (got, size)
    started = time.perf_counter()
    raw_got = len(await anyio.to_thread.run_sync(_raw, raw, "cat /tmp/big"))
    raw_s = time.perf_counter() - started
    assert raw_got == size
    return [("rift_vm_exec + rift_vm_exec_get (1 MiB each)", f"{BIG_MIB / rift_s:.1f}",
             f"{rift_s:.2f}", f"{(BIG_MIB / rift_s) / (BIG_MIB / raw_s):.2f}x"),
            ("raw paramiko cat", f"{BIG_MIB / raw_s:.1f}", f"{raw_s:.2f}", "1.00x")]


async def _run(url: str, token: str, data_dir: Path) -> None:
    async with _session(url, token, "bench-execs") as s:
        opened = await _tool(s, "rift_task_new", name="bench-execs")
        handle = opened["handle"]
        vm = (await _tool(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]
        raw = _open_raw(vm["ssh"]["port"], data_dir / "keys" / opened["task"]["id"])
        try:
            trip = await _round_trip(s, handle, vm["id"], raw)
            latency = await _latency(s, url, token, handle, vm["id"], raw)
            throughput = await _throughput(s, handle, vm["id"], raw)
        finally:
            raw.close()
            await _tool(s, "rift_task_close", handle=handle)
    print_table("exec round trip (`true`), medians", trip,
                ("path", "ms", "samples", "ratio", "target"))
    print_table("a byte written in the guest until seen, medians", latency,
                ("path", "ms", "samples", "target"))
    print_table(f"output throughput ({BIG_MIB} MiB of text)", throughput,
                ("path", "MiB/s", "s", "ratio"))


def against_server(name: str, scenario: Callable[[str, str, Path], Awaitable[None]],
                   module: str = "bench.execs") -> None:
    """Run `scenario(url, token, data dir)` against `module`'s `rift serve`-style
    child process (this module's: one `tiny` image, qemu:///system), then stop it."""
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    with work_dir(f"rift-bench-{name}-") as tmp:
        proc, url, token = _start(Path(tmp), module, within_s=60)
        try:
            anyio.run(scenario, url, token, Path(tmp))
        finally:
            proc.terminate()
            proc.wait(30)
            destroy_installation(Path(tmp), URI)


def main() -> None:
    against_server("execs", _run)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
