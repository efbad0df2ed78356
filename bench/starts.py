"""How fast each kind of start gives an agent a VM (issue #12), through MCP, each
against its raw floor, on qemu:///system (TCG here):

1. Rift: a real `rift serve` (tests/support/servers.start_real_server, `tiny` and
   `debian` seeded), driven by the official MCP SDK client (2026-07-28). For each
   start kind, the time from sending `rift_vm_new` to its answer and to the
   answer of the first `rift_vm_exec` of `true`, and the VM view's `start.ms`:
   - cold boot of `tiny` (256 MiB) and `debian` (512 MiB), no pool of that size;
   - restore from a saved pool (`rift pool set IMAGE --saved 1`): each sample
     waits until the pool has its saved VM, takes it, destroys it;
   - hand-out from a running pool (`--running 2`): each sample waits until both
     are ready, takes one, destroys it (20 samples for `debian`; with fewer than
     100 samples p99 is the nearest rank, that is the slowest);
   one start at a time; each phase's pool is cleared before the next. The
   server's `vm handed over` log lines give the hand-over's steps.
2. The floor (bench/restore_floor.py): Rift's own domain XML with raw libvirt,
   reached with raw paramiko on a new connection: `virDomainCreate` until an exec
   answers (cold boot), and after a managed save `virDomainCreate` of the saved
   domain until an exec answers (restore). For a hand-out, which can at best be
   one exec on a connection already open to a guest already running: execs of
   `true` on an open transport to a raw guest of the pool's size.
3. Memory: the QEMU RSS of each running pooled VM and the size of each saved
   one's managed save file, for both images.

    .venv/bin/python -m bench starts      (`make bench` runs it with the others)

Needs libvirtd on qemu:///system (scripts/libvirt.sh). The images are the tests'
cached ones (RIFT_TEST_CACHE, as scripts/test.sh sets it: /var/cache/rift-tests
when it can be made; built when missing or stale). Progress goes to stderr.
RIFT_BENCH_POOL_SAMPLES (default 20) sets the `debian` hand-outs.
RIFT_BENCH_STARTS_ROWS picks the tables: `kinds` (above), `first` (bench/first_exec.py:
the first command after a hand-out, restore, fork and wake, wake to first byte through
an exposure, density with sleep) or `all` (the default).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt
import paramiko
import pytest
from mcp.client.session import ClientSession

from bench import first_exec, restore_floor
from bench.common import print_table, work_dir
from bench.vms import qemu_rss_mib
from hypervisor.base import GuestDomain
from hypervisor.disks import make_overlay
from hypervisor.domain_xml import build_domain_xml
from hypervisor.image_files import ImageFiles, image_files
from hypervisor.kernel_boot import guest_spec
from hypervisor.kvm import TCG
from tests.support import mcp_clients
from tests.support.servers import (
    REAL_URI,
    Server,
    cached_debian,
    cached_tiny,
    log_lines,
    real_vms_missing,
    start_real_server,
    stop_server,
)
from tests.support.witnesses import our_domains, remove_domain, rows

BOOT_TIMEOUT_S = 180
FILL_S = 600.0  # one pool VM's boot (and save) under TCG on a busy machine, generously
CALL_S = 300.0  # the HTTP client's timeout: a cold boot of `debian` under TCG
BOOT_SAMPLES = 3
RESTORE_SAMPLES = 5
POOL_SAMPLES = int(os.environ.get("RIFT_BENCH_POOL_SAMPLES", "20"))
# which tables: `kinds` (the start kinds against their floors), `first` (bench/first_exec.py:
# the first command after each start, wake and density), or `all`
ROWS = os.environ.get("RIFT_BENCH_STARTS_ROWS", "all")
TINY_SAMPLES = 3  # tiny's hand-outs and restores: cheap, a few
FLOOR_SAMPLES = 3
FLOOR_EXECS = 20
POOL_RUNNING = 2
RETRIES = 3
SAVE_DIR = Path("/var/lib/libvirt/qemu/save")
# (image, MiB) of each start kind; a pool's size is its own, so phases never mix
SIZES = {"boot": {"tiny": 256, "debian": 512},
         "restore": {"tiny": 256, "debian": 512},
         "pool": {"tiny": 256, "debian": 576}}
TARGETS = {("pool", "debian"): "answer p50 < 100 ms, p99 < 250 ms",
           ("restore", "debian"): "first exec < 1.5 s",
           ("boot", "debian"): "first exec < 2x tiny's"}


def progress(text: str) -> None:
    print(f"[starts] {text}", file=sys.stderr, flush=True)


def p50(values: Sequence[float]) -> float:
    return statistics.median(values)


def p99(values: Sequence[float]) -> float:
    """Nearest rank: with fewer than 100 samples, the slowest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"


# -- Rift, through MCP -----------------------------------------------------------------------

@dataclass
class Kind:
    """The samples of one start kind of one image through Rift."""

    kind: str  # boot, restore, pool
    image: str
    memory_mib: int
    answer_s: list[float] = field(default_factory=list)
    exec_s: list[float] = field(default_factory=list)
    start_ms: list[int] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # VMs that did not come up
    vm_ids: list[str] = field(default_factory=list)


@dataclass
class Memory:
    running_rss_mib: dict[str, list[float]] = field(default_factory=dict)
    running_anon_mib: dict[str, list[float]] = field(default_factory=dict)
    saved_mib: dict[str, list[float]] = field(default_factory=dict)


def pools(srv: Server) -> list[dict[str, Any]]:
    listed = srv.rift("pool", "list", "--json")
    if listed.returncode != 0:
        raise RuntimeError(f"rift pool list: {listed.stderr.strip()}")
    return list(json.loads(listed.stdout))


def wait_pool(srv: Server, image: str, memory_mib: int, goal: str, want: int) -> None:
    """Until the pool of that image and size has `want` VMs ready in `goal`: polled
    in the store (each `rift pool list` is a Python start, a second of CPU that the
    refill's boot would share), then confirmed once by `rift pool list --json`."""
    state = "ready" if goal == "running" else "saved"
    deadline = time.monotonic() + FILL_S
    while time.monotonic() < deadline:
        if len(pooled_domains(srv, image, memory_mib, state)) >= want:
            break
        time.sleep(0.25)
    for pool in pools(srv):
        if (pool["image"], pool["memory_mib"]) == (image, memory_mib) and \
                pool[goal]["ready"] >= want:
            return
    raise RuntimeError(f"the {image} {memory_mib} MiB pool had no {want} {goal} VMs ready "
                       f"within {FILL_S:.0f} s: {pools(srv)}")


def rift_ok(srv: Server, *argv: str) -> None:
    done = srv.rift(*argv)
    if done.returncode != 0:
        raise RuntimeError(f"rift {' '.join(argv)}: {done.stderr.strip()}")


def pooled_domains(srv: Server, image: str, memory_mib: int, state: str) -> list[str]:
    """The domains of the pooled VMs of that image and size in `state`."""
    found = rows(srv, "SELECT id FROM pool_vms WHERE image = ? AND memory_mib = ? "
                      "AND state = ?", image, memory_mib, state)
    return [f"rift-{r['id']}" for r in found]


async def one_start(s: ClientSession, handle: str, into: Kind) -> None:
    """`rift_vm_new` → answer → first exec of `true` answered, then destroy the VM.
    A VM that did not come up (on this shared host, other work's tests have been
    seen destroying a booting guest's domain) is noted, dropped and tried again."""
    for _ in range(RETRIES):
        if await _one_start(s, handle, into):
            return
    raise RuntimeError(f"{into.image} {into.kind}: {RETRIES} VMs in a row did not come up")


async def _one_start(s: ClientSession, handle: str, into: Kind) -> bool:
    started = time.perf_counter()
    vm = (await mcp_clients.call(s, "rift_vm_new", handle=handle, image=into.image,
                                 memory_mib=into.memory_mib))["vm"]
    answered = time.perf_counter() - started
    if vm["status"] != "running":
        into.dropped.append(f"{vm['id']} after {answered:.0f} s: {vm['error']}")
        progress(f"{into.kind} {into.image} {into.memory_mib} MiB: DROPPED, {vm['id']} did "
                 f"not come up after {answered:.0f} s: {vm['error']}")
        await mcp_clients.call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
        return False
    ran = await mcp_clients.call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                 command="true", timeout_s=60)
    executed = time.perf_counter() - started
    if ran["exit_code"] != 0:
        raise RuntimeError(f"`true` answered {ran}")
    if vm["start"]["kind"] != into.kind:
        raise RuntimeError(f"{into.image} at {into.memory_mib} MiB started as "
                           f"{vm['start']['kind']}, not {into.kind}")
    into.answer_s.append(answered)
    into.exec_s.append(executed)
    into.start_ms.append(int(vm["start"]["ms"]))
    into.vm_ids.append(vm["id"])
    await mcp_clients.call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
    progress(f"{into.kind} {into.image} {into.memory_mib} MiB #{len(into.answer_s)}: "
             f"answer {ms(answered)}, first exec {ms(executed)}, start.ms {vm['start']['ms']}")
    return True


async def rift_side(srv: Server, memory: Memory) -> list[Kind]:
    kinds: list[Kind] = []
    async with mcp_clients.mcp_session(srv.url, srv.token, "rift-bench-starts") as s:
        handle = (await mcp_clients.call(s, "rift_task_new", name="bench starts"))["handle"]
        # a warm-up start: the task's key, the image's first read, the accelerator verdict
        await one_start(s, handle, Kind("boot", "tiny", SIZES["boot"]["tiny"]))
        for image in ("tiny", "debian"):
            cold = Kind("boot", image, SIZES["boot"][image])
            kinds.append(cold)
            for _ in range(BOOT_SAMPLES):
                await one_start(s, handle, cold)
        for image, n in (("debian", RESTORE_SAMPLES), ("tiny", TINY_SAMPLES)):
            restore = Kind("restore", image, SIZES["restore"][image])
            kinds.append(restore)
            rift_ok(srv, "pool", "set", image, "--saved", "1", "--memory-mib",
                    str(restore.memory_mib))
            for _ in range(n):
                wait_pool(srv, image, restore.memory_mib, "saved", 1)
                for domain in pooled_domains(srv, image, restore.memory_mib, "saved"):
                    size = (SAVE_DIR / f"{domain}.save").stat().st_size / 2**20
                    memory.saved_mib.setdefault(image, []).append(size)
                await one_start(s, handle, restore)
            # let the refill end first: a start that `pool clear` cuts is waited on by
            # the filler until the boot timeout, holding the host from other pools
            wait_pool(srv, image, restore.memory_mib, "saved", 1)
            rift_ok(srv, "pool", "clear", image)
        for image, n in (("debian", POOL_SAMPLES), ("tiny", TINY_SAMPLES)):
            handout = Kind("pool", image, SIZES["pool"][image])
            kinds.append(handout)
            rift_ok(srv, "pool", "set", image, "--running", str(POOL_RUNNING), "--memory-mib",
                    str(handout.memory_mib))
            for i in range(n):
                wait_pool(srv, image, handout.memory_mib, "running", POOL_RUNNING)
                if i == 0:
                    for domain in pooled_domains(srv, image, handout.memory_mib, "ready"):
                        rss, anon = qemu_rss_mib(domain)
                        memory.running_rss_mib.setdefault(image, []).append(rss)
                        memory.running_anon_mib.setdefault(image, []).append(anon)
                await one_start(s, handle, handout)
            wait_pool(srv, image, handout.memory_mib, "running", POOL_RUNNING)
            rift_ok(srv, "pool", "clear", image)
        await mcp_clients.call(s, "rift_task_close", handle=handle)
    return kinds


def handed_over_steps(srv: Server, kinds: list[Kind]) -> dict[str, dict[str, list[float]]]:
    """The server's `vm handed over` lines of the measured VMs: "kind image" -> step
    -> ms."""
    image_of = {vm_id: k.image for k in kinds for vm_id in k.vm_ids}
    steps: dict[str, dict[str, list[float]]] = {}
    for line in log_lines(srv.log):
        if line.get("msg") == "vm handed over" and line.get("vm_id") in image_of:
            into = steps.setdefault(f"{line.get('start')} {image_of[line['vm_id']]}", {})
            for key, value in line.items():
                if key.endswith("_ms") and isinstance(value, int | float):
                    into.setdefault(key, []).append(float(value))
    return steps


# -- the floor: raw libvirt + raw paramiko -------------------------------------------------

@dataclass
class Floors:
    boot_s: dict[str, list[float]] = field(default_factory=dict)
    restore_s: dict[str, list[float]] = field(default_factory=dict)
    save_mib: dict[str, list[float]] = field(default_factory=dict)
    exec_s: dict[str, list[float]] = field(default_factory=dict)
    rss_mib: dict[str, list[float]] = field(default_factory=dict)


def open_transport(port: int, key: paramiko.PKey) -> paramiko.Transport:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(sock)
    transport.banner_timeout = 10
    transport.start_client(timeout=10)
    transport.auth_publickey("root", key)
    return transport


def exec_on(transport: paramiko.Transport) -> float:
    started = time.perf_counter()
    chan = transport.open_session(timeout=10)
    try:
        chan.exec_command("true")
        status = chan.recv_exit_status()
    finally:
        chan.close()
    if status != 0:
        raise RuntimeError(f"`true` exited {status}")
    return time.perf_counter() - started


def exec_floor(conn: libvirt.virConnect, image: ImageFiles, memory_mib: int, work: Path,
               public: str, key: paramiko.PKey) -> tuple[list[float], float]:
    """A raw guest booted and answering; `FLOOR_EXECS` execs of `true` on one open
    transport (after 3 unmeasured), and the guest's QEMU RSS."""
    name = f"rift-bench-starts-{os.getpid()}-{image.name}-{memory_mib}"
    port = restore_floor.free_port()
    serial = work / f"{name}.log"
    overlay = None
    if image.disk is not None:
        overlay = work / f"{name}.qcow2"
        make_overlay(image.disk, overlay, 10 * 2**30)
    spec = guest_spec(image, GuestDomain(
        name=name, task_id="task_benchsts", vm_id="vm_benchsts", vcpus=1,
        memory_mib=memory_mib, domain_type=TCG, ssh_port=port, serial_log=serial),
        public, disk=overlay)
    dom = conn.defineXML(build_domain_xml(spec))
    try:
        dom.create()
        restore_floor.exec_until_answer(port, key, time.perf_counter(), serial)
        time.sleep(2)  # let the guest settle, as a pooled one has
        transport = open_transport(port, key)
        try:
            for _ in range(3):
                exec_on(transport)
            took = [exec_on(transport) for _ in range(FLOOR_EXECS)]
        finally:
            transport.close()
        return took, qemu_rss_mib(name)[0]
    finally:
        restore_floor.put_away(dom, serial, overlay)


def floor_side(images: dict[str, ImageFiles], work: Path) -> Floors:
    from rift.guest.keys import key_for_task, load_key

    floors = Floors()
    conn = libvirt.open(REAL_URI)
    try:
        key_file, public = key_for_task(work / "keys", "task_benchsts")
        key = load_key(key_file)
        n = 0
        for name in ("tiny", "debian"):
            # boot and restore are one sample in restore_floor (boot, save, restore)
            assert SIZES["boot"][name] == SIZES["restore"][name]
            for _ in range(FLOOR_SAMPLES):
                n += 1
                got = restore_floor.one_sample(conn, images[name], SIZES["boot"][name], work,
                                               public, key, n)
                floors.boot_s.setdefault(name, []).append(got.boot_s)
                floors.restore_s.setdefault(name, []).append(got.restore_s)
                floors.save_mib.setdefault(name, []).append(got.save_mib)
                progress(f"floor {name} {SIZES['boot'][name]} MiB #{n}: boot→exec "
                         f"{ms(got.boot_s)}, restore→exec {ms(got.restore_s)}, save image "
                         f"{got.save_mib:.0f} MiB")
            took, rss = exec_floor(conn, images[name], SIZES["pool"][name], work, public, key)
            floors.exec_s[name] = took
            floors.rss_mib[name] = [rss]
            progress(f"floor {name} {SIZES['pool'][name]} MiB: exec on an open connection "
                     f"p50 {ms(p50(took))}, RSS {rss:.0f} MiB")
    finally:
        conn.close()
    return floors


# -- the tables ------------------------------------------------------------------------------

KIND_NAMES = {"boot": "cold boot", "restore": "restore (saved pool)",
              "pool": "hand-out (running pool)"}


def floor_of(kind: Kind, floors: Floors) -> list[float]:
    return {"boot": floors.boot_s, "restore": floors.restore_s,
            "pool": floors.exec_s}[kind.kind].get(kind.image, [])


def verdict(kind: Kind, kinds: list[Kind]) -> str:
    target = TARGETS.get((kind.kind, kind.image))
    if target is None:
        return ""
    if kind.kind == "pool":
        met = p50(kind.answer_s) < 0.100 and p99(kind.answer_s) < 0.250
    elif kind.kind == "restore":
        met = p50(kind.exec_s) < 1.5
    else:
        tiny = next(k for k in kinds if (k.kind, k.image) == ("boot", "tiny"))
        met = p50(kind.exec_s) < 2 * p50(tiny.exec_s)
    return f"{target}: {'ok' if met else 'MISSED'}"


def start_rows(kinds: list[Kind], floors: Floors) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k in kinds:
        floor = floor_of(k, floors)
        ratio = f"{p50(k.exec_s) / p50(floor):.2f}" if floor else "-"
        out.append((KIND_NAMES[k.kind], k.image, str(k.memory_mib), str(len(k.answer_s)),
                    ms(p50(k.answer_s)), ms(p99(k.answer_s)), ms(p50(k.exec_s)),
                    ms(p99(k.exec_s)), f"{p50(k.start_ms):,.0f} ms",
                    f"{ms(p50(floor))} (n={len(floor)})" if floor else "-", ratio,
                    verdict(k, kinds)))
    return out


def step_rows(steps: dict[str, dict[str, list[float]]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for kind, by_step in sorted(steps.items()):
        for step, values in sorted(by_step.items()):
            out.append((kind, step, str(len(values)), f"{p50(values):,.1f}",
                        f"{p99(values):,.1f}", f"{min(values):,.1f}–{max(values):,.1f}"))
    return out


def memory_rows(memory: Memory, floors: Floors) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for image in ("tiny", "debian"):
        rss = memory.running_rss_mib.get(image)
        if rss:
            anon = memory.running_anon_mib[image]
            floor = floors.rss_mib.get(image)
            out.append((f"running pooled VM: QEMU RSS ({SIZES['pool'][image]} MiB guest)",
                        image, f"{p50(rss):.0f} MiB",
                        f"n={len(rss)}, {min(rss):.0f}–{max(rss):.0f}; anonymous "
                        f"{p50(anon):.0f} MiB; raw guest {p50(floor):.0f} MiB" if floor
                        else f"n={len(rss)}"))
        saved = memory.saved_mib.get(image)
        if saved:
            floor = floors.save_mib.get(image)
            out.append((f"saved pooled VM: managed save file ({SIZES['restore'][image]} MiB "
                        "guest)", image, f"{p50(saved):.0f} MiB",
                        f"n={len(saved)}, {min(saved):.0f}–{max(saved):.0f}"
                        + (f"; raw save after first exec {p50(floor):.0f} MiB" if floor
                           else "")))
    return out


# -- the run ---------------------------------------------------------------------------------

def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    missing = real_vms_missing()
    if missing is not None:
        print(f"\n## starts through MCP: skipped, {missing}")
        return 0
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # the floor's refused polls
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        folders = {"tiny": cached_tiny(), "debian": cached_debian()}
    except pytest.skip.Exception as exc:
        print(f"\n## starts through MCP: skipped, {exc}")
        return 0
    images = {name: image_files(folder.parent, name) for name, folder in folders.items()}
    if ROWS in ("all", "first"):
        with work_dir("rift-bench-first-") as tmp:
            first_exec.main(images, Path(tmp),
                            lambda where, **kw: start_real_server(
                                where, RIFT_VM_BOOT_TIMEOUT_S=str(BOOT_TIMEOUT_S), **kw),
                            cleanup, wait_pool, rift_ok)
        if ROWS == "first":
            return 0
    began_load = load()
    progress(f"load average before: {began_load}")
    memory = Memory()
    with work_dir("rift-bench-starts-") as tmp:
        work = Path(tmp)
        floors = floor_side(images, work)
        proc, srv = start_real_server(work / "rift", debian=True,
                                      RIFT_VM_BOOT_TIMEOUT_S=str(BOOT_TIMEOUT_S))
        kinds: list[Kind] = []
        try:
            previous = mcp_clients.WAIT_S
            mcp_clients.WAIT_S = int(CALL_S)  # the SDK client's HTTP timeout: cold boots
            try:
                kinds = mcp_clients.run(lambda: rift_side(srv, memory), limit_s=7200)
            finally:
                mcp_clients.WAIT_S = previous
            steps = handed_over_steps(srv, kinds)
        finally:
            cleanup(srv, proc)
    ended_load = load()
    accel = json.loads((folders["tiny"].parent / ".accel.json").read_text()) \
        .get(REAL_URI, {}).get("accel", "?") if (folders["tiny"].parent / ".accel.json") \
        .exists() else "?"
    print_table(f"Starts through MCP (SDK client) against the raw floor, {REAL_URI} "
                f"({accel}; load average {began_load} before, {ended_load} after)",
                start_rows(kinds, floors),
                ("start kind", "image", "MiB", "n", "answer p50", "answer p99",
                 "first exec p50", "first exec p99", "start.ms p50", "raw floor p50",
                 "exec / floor", "target"))
    print("\nanswer: `rift_vm_new` sent until its answer; first exec: until the answer of "
          "the first `rift_vm_exec true`; p99 is the nearest rank (the slowest of fewer than "
          "100). Floors: cold boot and restore as bench/restore_floor.py (raw libvirt, raw "
          "paramiko on a new connection until an exec answers); hand-out: one exec on an "
          "open connection to a running raw guest of the pool's size.")
    for k in kinds:
        for what in k.dropped:
            print(f"dropped ({KIND_NAMES[k.kind]}, {k.image}): {what}")
    print_table("The server's hand-over steps (`vm handed over` log lines), ms",
                step_rows(steps), ("start, image", "step", "n", "p50", "p99", "range"))
    print_table("Memory each pooled VM costs", memory_rows(memory, floors),
                ("what", "image", "median", "detail"))
    return 0


def cleanup(srv: Server, proc: subprocess.Popen[str]) -> None:
    for image in ("tiny", "debian"):
        srv.rift("pool", "clear", image)
    stop_server(proc)
    left = our_domains(srv)
    for domain in left.values():  # a failed run leaves no guest (nor saved state) behind
        subprocess.run(["virsh", "-c", REAL_URI, "managedsave-remove", domain.name],
                       capture_output=True, timeout=60, check=False)
        remove_domain(domain.name)
    if left:
        raise RuntimeError(f"domains left behind (removed): {sorted(left)}")

if __name__ == "__main__":
    sys.exit(main())
