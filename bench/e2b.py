"""The E2B door's benchmarks (issue #28, SPEC §16), on qemu:///system (TCG here), one
`rift serve` (tests/support/servers.start_real_server, `tiny` 256 MiB), in one run:

1. `Sandbox.create()` to the answer of the first `commands.run("true")` (E2B's own
   sync SDK, pointed at the door; the figure computesdk's benchmark publishes) from a
   running pool (`rift pool set tiny --running 2`), against the same through MCP on
   one open session (`rift_task_new` + `rift_vm_new` + `rift_vm_exec` of `true`), and
   against the raw floor of a hand-out as bench/starts.py takes it: an exec on an SSH
   connection already open to a running guest of the same image and size (raw
   paramiko, the MCP VM's own key). Each sample waits until both pooled VMs are
   ready; E2B and MCP samples take turns, the sandbox killed and the task closed
   after each;
2. the round trip of `commands.run("true")` on a sandbox against `rift_vm_exec` of
   `true` on a VM of the same image, and raw paramiko on an open connection;
   interleaved blocks;
3. file write and read of `SIZE_MIB` MiB of random bytes: `files.write`/`files.read`
   (envd's `/files`) against `rift_vm_write_file`/`rift_vm_read_file` (base64) and
   raw paramiko (`cat` in, `cat` out).

p50 and p99 (nearest rank: of fewer than 100 samples, the slowest) of each, and the
ratio of the E2B figure to Rift's own door (goal: at most 1.2x). Progress to stderr.

    flock /tmp/rift-heavy.lock make bench BENCH=e2b   (RIFT_BENCH_E2B_SAMPLES: 10 creates)
"""

from __future__ import annotations

import base64
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import paramiko
import pytest
from e2b import Sandbox
from mcp.client.session import ClientSession

from bench.common import print_table, work_dir
from bench.execs import _open_raw, _raw
from bench.starts import cleanup, load, ms, p50, p99, rift_ok, wait_pool
from tests.support import mcp_clients
from tests.support.e2b import Door, e2b_opts
from tests.support.servers import REAL_URI, Server, real_vms_missing, start_real_server

IMAGE, MEMORY_MIB, POOL_RUNNING = "tiny", 256, 2
SAMPLES = int(os.environ.get("RIFT_BENCH_E2B_SAMPLES", "10"))
TRIP_BLOCKS, TRIP_CALLS = 6, 10
SIZE_MIB, FILE_SAMPLES, GOAL = 8, 5, 1.2
GUEST_FILE = "/tmp/rift-bench-e2b.bin"  # in the guest  # noqa: S108


def progress(text: str) -> None:
    print(f"[e2b] {text}", file=sys.stderr, flush=True)


def _doors() -> dict[str, list[float]]:
    return {"e2b": [], "mcp": [], "raw": []}  # seconds of each sample, by door


@dataclass
class Figures:
    create: dict[str, list[float]] = field(default_factory=_doors)  # to the first `true`
    answered: dict[str, list[float]] = field(default_factory=_doors)  # to the create's answer
    trip: dict[str, list[float]] = field(default_factory=_doors)
    write: dict[str, list[float]] = field(default_factory=_doors)
    read: dict[str, list[float]] = field(default_factory=_doors)


async def atimed(call: Callable[[], Awaitable[object]]) -> float:
    began = time.perf_counter()
    await call()
    return time.perf_counter() - began


# -- the E2B side (the sync SDK, as most code calls it) ----------------------------------

def e2b_create_and_run(srv: Server, opts: dict[str, Any]) -> tuple[float, float]:
    """Sandbox.create() until it answered, and until its first `true` answered; the
    sandbox then killed. A sandbox that was not a hand-out fails the run (the pool
    was not ready)."""
    began = time.perf_counter()
    sbx = Sandbox.create(template=IMAGE, **opts)
    answered = time.perf_counter() - began
    ran = sbx.commands.run("true")
    took = time.perf_counter() - began
    try:
        if ran.exit_code != 0:
            raise RuntimeError(f"`true` answered {ran}")
        start = Door(srv, opts).vm(sbx.sandbox_id)["start"]["kind"]
        if start != "pool":
            raise RuntimeError(f"the sandbox's VM was a {start} start, not a hand-out")
    finally:
        sbx.kill()
    return answered, took


# -- the MCP side ------------------------------------------------------------------------

async def mcp_create_and_run(s: ClientSession) -> tuple[float, float]:
    """rift_task_new + rift_vm_new + rift_vm_exec `true`; the task then closed."""
    began = time.perf_counter()
    handle = (await mcp_clients.call(s, "rift_task_new", name="bench e2b"))["handle"]
    vm = (await mcp_clients.call(s, "rift_vm_new", handle=handle, image=IMAGE))["vm"]
    answered = time.perf_counter() - began
    ran = await mcp_clients.call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                 command="true")
    took = time.perf_counter() - began
    await mcp_clients.call(s, "rift_task_close", handle=handle)
    if ran["exit_code"] != 0 or vm["start"]["kind"] != "pool":
        raise RuntimeError(f"a hand-out answered {vm['start']}, `true` {ran['exit_code']}")
    return answered, took


async def creates(srv: Server, s: ClientSession, opts: dict[str, Any], into: Figures) -> None:
    rift_ok(srv, "pool", "set", IMAGE, "--running", str(POOL_RUNNING), "--memory-mib",
            str(MEMORY_MIB))
    for n in range(SAMPLES + 1):  # the first pair is a warm-up, not counted
        turns: list[tuple[str, Callable[[], Awaitable[tuple[float, float]]]]] = [
            ("e2b", lambda: anyio.to_thread.run_sync(e2b_create_and_run, srv, opts)),
            ("mcp", lambda: mcp_create_and_run(s))]
        for door, sample in (turns if n % 2 == 0 else turns[::-1]):
            wait_pool(srv, IMAGE, MEMORY_MIB, "running", POOL_RUNNING)
            time.sleep(1)  # the pool's filler done with the guest
            answered, took = await sample()
            if n:
                into.answered[door].append(answered)
                into.create[door].append(took)
            progress(f"{door} create #{n}: answered {ms(answered)}, first `true` {ms(took)}"
                     + ("" if n else " (warm-up)"))
    wait_pool(srv, IMAGE, MEMORY_MIB, "running", POOL_RUNNING)
    rift_ok(srv, "pool", "clear", IMAGE)


async def round_trips(s: ClientSession, handle: str, vm_id: str, sbx: Sandbox,
                      raw: paramiko.Transport, into: Figures) -> None:
    async def mcp_true() -> None:
        ran = await mcp_clients.call(s, "rift_vm_exec", handle=handle, vm_id=vm_id,
                                     command="true")
        assert ran["exit_code"] == 0, ran

    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("e2b", lambda: anyio.to_thread.run_sync(lambda: sbx.commands.run("true"))),
        ("mcp", mcp_true),
        ("raw", lambda: anyio.to_thread.run_sync(_raw, raw, "true"))]
    for _, call in calls:  # warm-up
        for _ in range(3):
            await call()
    for block in range(TRIP_BLOCKS):
        for door, call in (calls if block % 2 == 0 else calls[::-1]):
            into.trip[door] += [await atimed(call) for _ in range(TRIP_CALLS)]
    progress("round trips: " + ", ".join(f"{d} p50 {ms(p50(v))}" for d, v in into.trip.items()))


def raw_write(transport: paramiko.Transport, data: bytes) -> None:
    chan = transport.open_session(timeout=10)
    try:
        chan.exec_command(f"cat > {GUEST_FILE}")
        chan.sendall(data)
        chan.shutdown_write()
        if chan.recv_exit_status() != 0:
            raise RuntimeError("raw write failed")
    finally:
        chan.close()


async def files(s: ClientSession, handle: str, vm_id: str, sbx: Sandbox,
                raw: paramiko.Transport, into: Figures) -> None:
    data = os.urandom(SIZE_MIB << 20)
    encoded = base64.b64encode(data).decode()

    def e2b_read() -> None:
        assert bytes(sbx.files.read(GUEST_FILE, format="bytes")) == data

    async def mcp_write() -> None:
        await mcp_clients.call(s, "rift_vm_write_file", handle=handle, vm_id=vm_id,
                               path=GUEST_FILE, content=encoded, encoding="base64")

    async def mcp_read() -> None:
        got = await mcp_clients.call(s, "rift_vm_read_file", handle=handle, vm_id=vm_id,
                                     path=GUEST_FILE, encoding="base64")
        assert not got["truncated"] and base64.b64decode(got["content"]) == data

    doors: list[tuple[str, Callable[[], Awaitable[object]], Callable[[], Awaitable[object]]]] = [
        ("e2b", lambda: anyio.to_thread.run_sync(lambda: sbx.files.write(GUEST_FILE, data)),
         lambda: anyio.to_thread.run_sync(e2b_read)),
        ("mcp", mcp_write, mcp_read),
        ("raw", lambda: anyio.to_thread.run_sync(raw_write, raw, data),
         lambda: anyio.to_thread.run_sync(lambda: _raw(raw, f"cat {GUEST_FILE}")))]
    for n in range(FILE_SAMPLES + 1):  # the first round is a warm-up
        for door, write, read in (doors if n % 2 == 0 else doors[::-1]):
            wrote, got = await atimed(write), await atimed(read)
            if n:
                into.write[door].append(wrote)
                into.read[door].append(got)
    progress("files: " + ", ".join(f"{d} write p50 {ms(p50(into.write[d]))} read p50 "
                                   f"{ms(p50(into.read[d]))}" for d in into.write))


async def rift_side(srv: Server, into: Figures) -> None:
    opts = e2b_opts(srv.url, srv.token)
    async with mcp_clients.mcp_session(srv.url, srv.token, "rift-bench-e2b") as s:
        await creates(srv, s, opts, into)
        opened = await mcp_clients.call(s, "rift_task_new", name="bench e2b trips")
        handle = opened["handle"]
        vm = (await mcp_clients.call(s, "rift_vm_new", handle=handle, image=IMAGE))["vm"]
        sbx = await anyio.to_thread.run_sync(lambda: Sandbox.create(template=IMAGE, **opts))
        raw = _open_raw(vm["ssh"]["port"], srv.data_dir / "keys" / opened["task"]["id"])
        try:
            await round_trips(s, handle, vm["id"], sbx, raw, into)
            await files(s, handle, vm["id"], sbx, raw, into)
        finally:
            raw.close()
            await anyio.to_thread.run_sync(sbx.kill)
            await mcp_clients.call(s, "rift_task_close", handle=handle)


# -- the tables --------------------------------------------------------------------------

def mib_s(seconds: list[float]) -> tuple[str, str]:
    """MiB/s at the median and at the p99 (the slowest) transfer."""
    return f"{SIZE_MIB / p50(seconds):.1f}", f"{SIZE_MIB / p99(seconds):.1f}"


def rows(into: Figures) -> list[tuple[str, ...]]:
    floor = into.trip["raw"]  # an exec on an open connection: a hand-out's floor
    e2b, mcp = into.create["e2b"], into.create["mcp"]
    out = [
        ("Sandbox.create() → first commands.run(\"true\") answered", str(len(e2b)),
         ms(p50(e2b)), ms(p99(e2b)), f"{p50(e2b) / p50(mcp):.2f}x",
         f"{p50(e2b) / p50(floor):.1f}x"),
        ("rift_task_new + rift_vm_new + rift_vm_exec true (MCP)", str(len(mcp)),
         ms(p50(mcp)), ms(p99(mcp)), "1.00x", f"{p50(mcp) / p50(floor):.1f}x"),
        ("  of which Sandbox.create() answered", str(len(e2b)),
         ms(p50(into.answered["e2b"])), ms(p99(into.answered["e2b"])),
         f"{p50(into.answered['e2b']) / p50(into.answered['mcp']):.2f}x", ""),
        ("  of which rift_task_new + rift_vm_new answered (MCP)", str(len(mcp)),
         ms(p50(into.answered["mcp"])), ms(p99(into.answered["mcp"])), "1.00x", ""),
        ("commands.run(\"true\") round trip", str(len(into.trip["e2b"])),
         ms(p50(into.trip["e2b"])), ms(p99(into.trip["e2b"])),
         f"{p50(into.trip['e2b']) / p50(into.trip['mcp']):.2f}x",
         f"{p50(into.trip['e2b']) / p50(floor):.1f}x"),
        ("rift_vm_exec true round trip (MCP)", str(len(into.trip["mcp"])),
         ms(p50(into.trip["mcp"])), ms(p99(into.trip["mcp"])), "1.00x",
         f"{p50(into.trip['mcp']) / p50(floor):.1f}x"),
        ("raw floor: paramiko exec of true, open connection", str(len(floor)),
         ms(p50(floor)), ms(p99(floor)), "", "1.0x")]
    for what, samples in (("write", into.write), ("read", into.read)):
        names = {"e2b": f"files.{what} (envd /files)",
                 "mcp": f"rift_vm_{what}_file (MCP, base64)",
                 "raw": f"raw floor: paramiko cat {'in' if what == 'write' else 'out'}"}
        for door in ("e2b", "mcp", "raw"):
            got = samples[door]
            at50, at99 = mib_s(got)
            # a throughput ratio as a time ratio: E2B's time over MCP's (goal <= 1.2x)
            out.append((f"{SIZE_MIB} MiB {what}: {names[door]}", str(len(got)),
                        f"{at50} MiB/s", f"{at99} MiB/s",
                        "" if door == "raw" else
                        f"{p50(got) / p50(samples['mcp']):.2f}x",
                        f"{p50(got) / p50(samples['raw']):.1f}x"))
    return out


def main() -> int:
    missing = real_vms_missing()
    if missing is not None:
        print(f"\n## the E2B door: skipped, {missing}")
        return 0
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    began_load = load()
    into = Figures()
    with work_dir("rift-bench-e2b-") as tmp:
        try:
            proc, srv = start_real_server(Path(tmp), RIFT_VM_BOOT_TIMEOUT_S="180",
                                          RIFT_DEFAULT_IMAGE=IMAGE)
        except pytest.fail.Exception as exc:
            raise RuntimeError(str(exc)) from exc
        try:
            mcp_clients.run(lambda: rift_side(srv, into), limit_s=3600)
        finally:
            cleanup(srv, proc)
    print_table(f"The E2B door against Rift's own door (MCP) and the raw floor, `{IMAGE}` "
                f"{MEMORY_MIB} MiB, {REAL_URI} (load average {began_load} before, {load()} "
                f"after)", rows(into),
                ("what", "n", "p50", "p99", f"time / MCP's (goal <= {GOAL}x)",
                 "time / raw floor"))
    print("\nCreates are hand-outs from a running pool of 2; a hand-out's raw floor is one exec "
          "on an open connection (bench/starts.py). MiB/s: at the p50 and the slowest.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
