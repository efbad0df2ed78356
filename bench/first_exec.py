"""The first command after each kind of start, and what sleep does for density
(issue #29), through MCP on a real `rift serve` (qemu:///system, TCG here):

- first exec after a hand-out (running pool), a restore (saved pool), a fork (of a
  running VM) and a wake (by a file read), each against the p50 of the next
  `FOLLOW_EXECS` execs of the same VM: an exec on a connection already open (goal
  ≤ 1.3x);
- the exec that wakes the VM: its time less the VM's `woke.ms` (its exec part)
  against the same open connection (no goal of its own: it carries the guest's
  first work after the restore, which the wake's row below counts);
- wake to first exec (that exec's whole time), and wake to the first byte through
  an exposure URL (busybox httpd, python3's http.server on debian), against the raw
  restore floor of the same VM (goal ≤ 1.2x): its own saved state and disk copied
  aside while it sleeps, just before each wake, restored by raw libvirt as a domain
  of its own until an exec of `true` answers on a new paramiko connection
  (bench/restore_floor.py `same_state_sample`); printed beside, the floor of a
  fresh guest of the same image and size (booted, one exec, saved, restored:
  `one_sample`), which holds less memory than a VM that has worked;
- density: a running VM's QEMU RSS against what the same VM holds asleep (no
  process; its managed save file on disk), as tasks per GiB of host memory.

    RIFT_BENCH_STARTS_ROWS=first .venv/bin/python -m bench starts

RIFT_BENCH_FIRST_IMAGE (default `tiny`) picks the image, RIFT_BENCH_FIRST_SAMPLES
(default 3) the samples of each kind, RIFT_BENCH_FIRST_THINK_S (default 1) the pause
between a start's answer and its first exec (an agent's model reads it first; 0 sends
it at once), RIFT_BENCH_FIRST_KINDS=wake only the floor and the wakes. Progress: stderr.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import libvirt
import paramiko
from mcp.client.session import ClientSession

from bench import restore_floor
from bench.common import print_table
from bench.vms import qemu_rss_mib
from hypervisor.image_files import ImageFiles
from rift.guest.keys import key_for_task, load_key
from tests.support import mcp_clients
from tests.support.servers import REAL_URI, Server, log_lines

IMAGE = os.environ.get("RIFT_BENCH_FIRST_IMAGE", "tiny")
SAMPLES = int(os.environ.get("RIFT_BENCH_FIRST_SAMPLES", "3"))
# between a start's answer and its first exec: an agent's model reads the answer first
THINK_S = float(os.environ.get("RIFT_BENCH_FIRST_THINK_S", "1"))
MEMORY_MIB = {"tiny": 256, "debian": 512}
FOLLOW_EXECS = 3
SLEEP_AFTER_S = 2  # the sleepy task's; with a sweep every second it sleeps in ~4 s
SERVER_ENV = {"RIFT_SWEEP_INTERVAL_S": "1", "RIFT_ACTIVITY_STEP_S": "1"}
SAVE_DIR, HTTP_PORT = Path("/var/lib/libvirt/qemu/save"), 8001
WWW = "/tmp/www"  # noqa: S108 (a folder in the guest, served by its httpd)
HTTPD = {"tiny": f"busybox httpd -p 127.0.0.1:{HTTP_PORT} -h {WWW}",  # it goes to the back
         "debian": f"setsid python3 -m http.server {HTTP_PORT} --bind 127.0.0.1 -d {WWW} "
                   ">/dev/null 2>&1 </dev/null &"}
KINDS = ("hand-out", "restore", "fork", "wake", "wake by a read")
WAKES_ONLY = os.environ.get("RIFT_BENCH_FIRST_KINDS") == "wake"


def progress(text: str) -> None:
    print(f"[first exec] {text}", file=sys.stderr, flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


@dataclass
class Firsts:
    first_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    open_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    paused_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    woke_ms: list[float] = field(default_factory=list)
    http_first_byte_s: list[float] = field(default_factory=list)
    http_woke_ms: list[float] = field(default_factory=list)
    running_rss_mib: list[float] = field(default_factory=list)
    asleep_processes: list[int] = field(default_factory=list)
    save_mib: list[float] = field(default_factory=list)
    floor_restore_s: list[float] = field(default_factory=list)  # a fresh guest's
    floor_own_s: list[float] = field(default_factory=list)  # the VM's own saved state


async def timed(call: Awaitable[Any]) -> tuple[float, Any]:
    began, got = time.perf_counter(), await call
    return time.perf_counter() - began, got


async def exec_s(s: ClientSession, handle: str, vm_id: str, command: str = "true") -> float:
    took, ran = await timed(mcp_clients.call(s, "rift_vm_exec", handle=handle, vm_id=vm_id,
                                             command=command, timeout_s=60))
    if ran["exit_code"] != 0:
        raise RuntimeError(f"`{command}` answered {ran}")
    return took


async def first_and_open(s: ClientSession, handle: str, vm_id: str, into: Firsts,
                         kind: str) -> None:
    time.sleep(THINK_S)  # the agent's model reading the answer
    first = await exec_s(s, handle, vm_id)
    follow = [await exec_s(s, handle, vm_id) for _ in range(FOLLOW_EXECS)]
    time.sleep(THINK_S)  # the same pause before an exec of a VM long warm
    into.paused_s[kind].append(await exec_s(s, handle, vm_id))
    into.first_s[kind].append(first)
    into.open_s[kind].append(statistics.median(follow))
    progress(f"{kind} #{len(into.first_s[kind])}: first exec {ms(first)}, then "
             f"{', '.join(ms(f) for f in follow)}")


async def vm_view(s: ClientSession, vm_id: str) -> dict[str, Any]:
    return dict((await mcp_clients.call(s, "rift_vm_get", vm_id=vm_id))["vm"])


async def until_status(s: ClientSession, vm_id: str, status: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while (await vm_view(s, vm_id))["status"] != status:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{vm_id} not {status} after {limit_s:.0f} s")
        time.sleep(0.25)


async def new_vm(s: ClientSession, handle: str, kind: str) -> dict[str, Any]:
    vm = (await mcp_clients.call(s, "rift_vm_new", handle=handle, image=IMAGE,
                                 memory_mib=MEMORY_MIB[IMAGE]))["vm"]
    if vm["status"] != "running" or vm["start"]["kind"] != kind:
        raise RuntimeError(f"a {kind} start answered {vm['status']} {vm['start']}")
    return dict(vm)


async def pooled(srv: Server, s: ClientSession, handle: str, into: Firsts, goal: str,
                 wait_pool: Callable[[Server, str, int, str, int], None],
                 rift_ok: Callable[..., None]) -> None:
    kind, start = ("hand-out", "pool") if goal == "running" else ("restore", "restore")
    rift_ok(srv, "pool", "set", IMAGE, f"--{goal}", "1", "--memory-mib",
            str(MEMORY_MIB[IMAGE]))
    for _ in range(SAMPLES):
        wait_pool(srv, IMAGE, MEMORY_MIB[IMAGE], goal, 1)
        time.sleep(1)  # the pool's filler done with the guest
        vm = await new_vm(s, handle, start)
        await first_and_open(s, handle, vm["id"], into, kind)
        await mcp_clients.call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
    wait_pool(srv, IMAGE, MEMORY_MIB[IMAGE], goal, 1)
    rift_ok(srv, "pool", "clear", IMAGE)


async def forks(s: ClientSession, handle: str, source: str, into: Firsts) -> None:
    for _ in range(SAMPLES):
        fork = (await mcp_clients.call(s, "rift_vm_fork", handle=handle, vm_id=source))["vms"][0]
        if fork["status"] != "running":
            raise RuntimeError(f"a fork answered {fork}")
        await first_and_open(s, handle, fork["id"], into, "fork")
        await mcp_clients.call(s, "rift_vm_destroy", handle=handle, vm_id=fork["id"])


async def wakes(srv: Server, s: ClientSession, into: Firsts, floor: Floor) -> None:
    opened = await mcp_clients.call(s, "rift_task_new", name="bench wakes",
                                    sleep_after_s=SLEEP_AFTER_S)
    handle = opened["handle"]
    vm_key = load_key(key_for_task(srv.data_dir / "keys", opened["task"]["id"])[0])
    vm = (await mcp_clients.call(s, "rift_vm_new", handle=handle, image=IMAGE,
                                 memory_mib=MEMORY_MIB[IMAGE]))["vm"]
    vm_id, domain = vm["id"], f"rift-{vm['id']}"
    await exec_s(s, handle, vm_id, f"mkdir -p {WWW} && echo awake > {WWW}/i.txt && "
                                    f"{HTTPD[IMAGE]}")
    url = (await mcp_clients.call(s, "rift_vm_expose", handle=handle, vm_id=vm_id,
                                  port=HTTP_PORT))["exposure"]["url"]
    url = srv.url + "/x/" + url.split("/x/")[1] + "i.txt"
    with httpx.Client(timeout=120) as http:
        deadline = time.monotonic() + 60
        while http.get(url).text != "awake\n":  # its server may take a moment to start
            if time.monotonic() > deadline:
                raise RuntimeError("the exposure does not answer")
            time.sleep(0.5)
        for n in range(SAMPLES):
            await until_status(s, vm_id, "sleeping", 60)
            into.asleep_processes.append(qemu_processes(domain))
            into.save_mib.append((SAVE_DIR / f"{domain}.save").stat().st_size / 2**20)
            await asyncio.to_thread(floor, n, domain, vm_key)  # the raw floors, beside it
            took = await exec_s(s, handle, vm_id)  # wakes it
            into.woke_ms.append(float((await vm_view(s, vm_id))["woke"]["ms"]))
            follow = [await exec_s(s, handle, vm_id) for _ in range(FOLLOW_EXECS)]
            into.running_rss_mib.append(qemu_rss_mib(domain)[0])  # awake: a call just now
            into.first_s["wake"].append(took)
            into.open_s["wake"].append(statistics.median(follow))
            progress(f"wake #{n + 1}: exec that wakes {ms(took)} (woke.ms "
                     f"{into.woke_ms[-1]:.0f}), then {', '.join(ms(f) for f in follow)}")
            await until_status(s, vm_id, "sleeping", 60)
            await mcp_clients.call(s, "rift_vm_read_file", handle=handle, vm_id=vm_id,
                                   path=f"{WWW}/i.txt")  # wakes it
            await first_and_open(s, handle, vm_id, into, "wake by a read")
            await until_status(s, vm_id, "sleeping", 60)
            began = time.perf_counter()
            with http.stream("GET", url) as answer:
                next(answer.iter_raw(1))
                into.http_first_byte_s.append(time.perf_counter() - began)
            into.http_woke_ms.append(float((await vm_view(s, vm_id))["woke"]["ms"]))
            progress(f"wake #{n + 1}: first byte through the exposure "
                     f"{ms(into.http_first_byte_s[-1])} (woke.ms {into.http_woke_ms[-1]:.0f})")
    await mcp_clients.call(s, "rift_task_close", handle=handle)


def qemu_processes(domain: str) -> int:  # those running for `domain`: 0 asleep
    found = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu" in cmdline and f"guest={domain},".encode() in cmdline:
                found += 1
    return found


async def rift_side(srv: Server, into: Firsts, wait_pool: Callable[..., None],
                    rift_ok: Callable[..., None], floor: Floor) -> None:
    async with mcp_clients.mcp_session(srv.url, srv.token, "rift-bench-first") as s:
        if not WAKES_ONLY:
            handle = (await mcp_clients.call(s, "rift_task_new", name="bench first"))["handle"]
            source = (await mcp_clients.call(s, "rift_vm_new", handle=handle, image=IMAGE,
                                             memory_mib=MEMORY_MIB[IMAGE]))["vm"]["id"]
            await exec_s(s, handle, source)
            await forks(s, handle, source, into)
            await mcp_clients.call(s, "rift_vm_destroy", handle=handle, vm_id=source)
            await pooled(srv, s, handle, into, "running", wait_pool, rift_ok)
            await pooled(srv, s, handle, into, "saved", wait_pool, rift_ok)
            await mcp_clients.call(s, "rift_task_close", handle=handle)
        await wakes(srv, s, into, floor)


Floor = Callable[[int, str, paramiko.PKey], None]  # sample n, the sleeping domain, its key


def floor_sampler(conn: libvirt.virConnect, image: ImageFiles, work: Path,
                  into: Firsts) -> Floor:
    """Raw restore floor samples (bench/restore_floor.py), kept in `into`: a fresh
    guest's, then the sleeping VM's own state's, right before its wake."""
    key_file, public = key_for_task(work / "keys", "task_benchfirst")
    key: paramiko.PKey = load_key(key_file)

    def sample(n: int, domain: str, vm_key: paramiko.PKey) -> None:
        got = restore_floor.one_sample(conn, image, MEMORY_MIB[IMAGE], work, public, key,
                                       900 + n)
        into.floor_restore_s.append(got.restore_s)
        into.floor_own_s.append(restore_floor.same_state_sample(conn, domain, vm_key, work, n))
        progress(f"floor: raw restore → exec, the VM's own state {ms(into.floor_own_s[-1])}, "
                 f"a fresh guest {ms(got.restore_s)}")

    return sample


def p50(values: list[float]) -> float:  # nan where a phase measured nothing
    return statistics.median(values) if values else float("nan")


def print_rows(into: Firsts) -> None:
    rows: list[tuple[str, ...]] = []
    for kind in (*KINDS[:3], KINDS[4]):  # the exec that wakes a VM: below
        first, warm = p50(into.first_s[kind]), p50(into.open_s[kind])
        rows.append((f"first exec after a {kind}", str(len(into.first_s[kind])), ms(first),
                     f"{ms(warm)} (exec on an open connection)", f"{first / warm:.2f}",
                     "≤ 1.3x"))
        paused = p50(into.paused_s[kind])
        rows.append(("  the same against one after the same pause", str(len(into.first_s[kind])),
                     ms(first), f"{ms(paused)} (open, {THINK_S:g} s after the last)",
                     f"{first / paused:.2f}", "-"))
    woke, floor_s, fresh_s = (p50(into.woke_ms) / 1000, p50(into.floor_own_s),
                              p50(into.floor_restore_s))
    exec_part = p50([f - w / 1000 for f, w in zip(into.first_s["wake"], into.woke_ms,
                                                  strict=True)])
    rows.append(("exec part of the exec that wakes (its time less woke.ms)",
                 str(len(into.woke_ms)), ms(exec_part), ms(p50(into.open_s["wake"])),
                 f"{exec_part / p50(into.open_s['wake']):.2f}",
                 "none: in the wake's"))
    for what, took in (("wake to first exec", into.first_s["wake"]),
                       ("wake to first byte through an exposure URL", into.http_first_byte_s)):
        rows.append((what, str(len(took)), ms(p50(took)),
                     f"{ms(floor_s)} (raw restore of its state + exec)",
                     f"{p50(took) / floor_s:.2f}", "≤ 1.2x"))
        rows.append(("  the same against a fresh guest's floor", str(len(took)),
                     ms(p50(took)), f"{ms(fresh_s)} (raw restore + exec)",
                     f"{p50(took) / fresh_s:.2f}", "-"))
    print_table(f"First command after each start, `{IMAGE}` {MEMORY_MIB[IMAGE]} MiB, "
                f"through MCP ({REAL_URI}), {THINK_S:g} s from the answer to the first exec; "
                f"woke.ms p50 {woke * 1000:,.0f} ms", rows,
                ("what", "n", "p50", "against p50", "ratio", "goal"))
    rss, save = p50(into.running_rss_mib), p50(into.save_mib)
    print_table("Density: what a VM holds awake and asleep", [
        ("running", f"{rss:.0f} MiB QEMU RSS", "-", f"{1024 / rss:.1f}"),
        ("sleeping", f"{max(into.asleep_processes, default=0)} QEMU processes (0 MiB)",
         f"{save:.0f} MiB managed save", "not bound by memory (disk: "
         f"{1024 / save:.1f} per GiB)"),
        ("one in ten awake at a time", f"{rss / 10:.0f} MiB a task on average", "-",
         f"{10 * 1024 / rss:.1f}")],
        ("VM", "memory", "disk", "tasks open per GiB of host memory"))


STEP_LINES = ("vm handed over", "fork identity", "guest resumed", "vm woke")


def print_steps(srv: Server) -> None:
    """The server's own step timings (its log lines), p50 in ms."""
    steps: dict[tuple[str, str], list[float]] = {}
    for line in log_lines(srv.log):
        if line.get("msg") in STEP_LINES:
            for key, value in line.items():
                if (key.endswith("_ms") or key == "ms") and isinstance(value, int | float):
                    where = (f"{line['msg']} ({line.get('start', '')})" if line.get("start")
                             else str(line["msg"]))
                    steps.setdefault((where, key), []).append(float(value))
    print_table("Where the server's time went (its log lines), ms", [
        (where, key, str(len(v)), f"{p50(v):,.0f}", f"{min(v):,.0f}–{max(v):,.0f}")
        for (where, key), v in sorted(steps.items())], ("line", "step", "n", "p50", "range"))


def main(images: dict[str, ImageFiles], work: Path, start_server: Callable[..., Any],
         stop: Callable[..., None], wait_pool: Callable[..., None],
         rift_ok: Callable[..., None]) -> None:
    into = Firsts()
    conn = libvirt.open(REAL_URI)
    floor = floor_sampler(conn, images[IMAGE], work, into)
    proc, srv = start_server(work / "rift-first", debian=IMAGE == "debian", **SERVER_ENV)
    try:
        mcp_clients.run(lambda: rift_side(srv, into, wait_pool, rift_ok, floor), limit_s=3600)
    finally:
        stop(srv, proc)
        conn.close()
    print_rows(into)
    print_steps(srv)
