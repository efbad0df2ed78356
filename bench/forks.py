"""How fast a fork gives an agent a VM (issue #14), through MCP, against raw
libvirt restoring the same saved state, on qemu:///system (TCG here):

1. Rift: a real `rift serve` with `tiny` and `debian` seeded, driven by the
   official MCP SDK client (2026-07-28). One source VM per image (`tiny` 256 MiB,
   `debian` 512 MiB) and one `rift_vm_snapshot` of it (timed). Then, from that
   snapshot: single forks (`rift_vm_fork`, count 1), timed from the call to its
   answer and to the answer of the fork's first `rift_vm_exec true`; and
   four at once (`count` 4), until all four have answered a first exec. Each fork
   is destroyed before the next sample. The server's `vm forked` log lines give
   the steps (files, restore, identity).
2. The floor: the same snapshot's state file, with raw libvirt: a copy of it under
   another name, UUID and SSH port (hypervisor.save_image, as Rift does), the
   snapshot's disk copied, `virDomainDefineXML` + `virDomainRestore`, until raw
   paramiko on a new connection runs `true`. One, then four at once (threads).
3. Memory: the QEMU RSS of a running fork, and the snapshot's bytes on disk.

    .venv/bin/python -m bench forks      (`make bench` runs it with the others)

RIFT_BENCH_FORK_SAMPLES (default 5) sets the single forks per image;
RIFT_BENCH_FORK_IMAGES (default `tiny,debian`) the images.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import libvirt
import paramiko
import pytest
from mcp.client.session import ClientSession

from bench.common import print_table, work_dir
from bench.starts import exec_on, load, ms, open_transport, p50
from bench.vms import qemu_rss_mib
from hypervisor.fork_xml import fork_domain_xml
from hypervisor.save_image import read_save_header, write_fork
from rift.guest.keys import key_path, load_key
from tests.support import mcp_clients
from tests.support.mcp_clients import call
from tests.support.servers import (
    REAL_URI,
    Server,
    cached_debian,
    cached_tiny,
    free_port,
    log_lines,
    real_vms_missing,
    start_real_server,
    stop_server,
)
from tests.support.witnesses import our_domains, remove_domain

SAMPLES = int(os.environ.get("RIFT_BENCH_FORK_SAMPLES", "5"))
IMAGES = tuple((image, memory) for image, memory in (("tiny", 256), ("debian", 512))
               if image in os.environ.get("RIFT_BENCH_FORK_IMAGES", "tiny,debian").split(","))
AT_ONCE = 4


def progress(text: str) -> None:
    print(f"[forks] {text}", file=sys.stderr, flush=True)


@dataclass
class Side:
    """One image's figures."""

    image: str
    memory_mib: int
    snapshot_s: float = 0.0
    snapshot_bytes: int = 0
    answer_s: list[float] = field(default_factory=list)
    exec_s: list[float] = field(default_factory=list)
    four_s: float = 0.0
    rss_mib: list[float] = field(default_factory=list)
    floor_s: list[float] = field(default_factory=list)
    floor_four_s: float = 0.0
    snapshot_id: str = ""
    task_id: str = ""


async def _first_exec(s: ClientSession, handle: str, vm_id: str) -> None:
    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command="true")
    assert done["exit_code"] == 0, done


async def rift_side(srv: Server) -> list[Side]:
    sides = []
    async with mcp_clients.mcp_session(srv.url, srv.token, "bench") as s:
        handle = (await call(s, "rift_task_new", name="bench forks"))["handle"]
        task_id = (await call(s, "rift_task_get", handle=handle))["task"]["id"]
        for image, memory in IMAGES:
            side = Side(image, memory, task_id=task_id)
            source = (await call(s, "rift_vm_new", handle=handle, image=image,
                                 memory_mib=memory))["vm"]["id"]
            await _first_exec(s, handle, source)
            began = time.perf_counter()
            snap = (await call(s, "rift_vm_snapshot", handle=handle, vm_id=source))["snapshot"]
            side.snapshot_s = time.perf_counter() - began
            side.snapshot_bytes, side.snapshot_id = snap["bytes"], snap["id"]
            progress(f"{image}: snapshot {ms(side.snapshot_s)}, {snap['bytes'] >> 20} MiB")
            for n in range(SAMPLES):
                began = time.perf_counter()
                fork = (await call(s, "rift_vm_fork", handle=handle,
                                   snapshot_id=snap["id"]))["vms"][0]
                side.answer_s.append(time.perf_counter() - began)
                assert fork["status"] == "running", fork
                await _first_exec(s, handle, fork["id"])
                side.exec_s.append(time.perf_counter() - began)
                side.rss_mib.append(qemu_rss_mib(f"rift-{fork['id']}")[0])
                await call(s, "rift_vm_destroy", handle=handle, vm_id=fork["id"])
                progress(f"{image}: fork {n + 1}/{SAMPLES} {ms(side.exec_s[-1])}")
            began = time.perf_counter()
            four = (await call(s, "rift_vm_fork", handle=handle, snapshot_id=snap["id"],
                               count=AT_ONCE))["vms"]
            for fork in four:
                await _first_exec(s, handle, fork["id"])
            side.four_s = time.perf_counter() - began
            progress(f"{image}: {AT_ONCE} at once {ms(side.four_s)}")
            for fork in four:
                await call(s, "rift_vm_destroy", handle=handle, vm_id=fork["id"])
            await call(s, "rift_vm_destroy", handle=handle, vm_id=source)
            sides.append(side)
    return sides


# -- the floor: raw libvirt restoring the same state -----------------------------------------

_PORTS_LOCK = threading.Lock()
_PORTS_TAKEN: set[int] = set()


def _own_port() -> int:
    """A free port no other raw fork of this run was given (threads pick at once)."""
    with _PORTS_LOCK:
        while (port := free_port()) in _PORTS_TAKEN:
            pass
        _PORTS_TAKEN.add(port)
        return port


def _raw_fork(conn: libvirt.virConnect, srv: Server, side: Side, work: Path,
              key: paramiko.PKey, n: int) -> tuple[str, float]:
    """One raw fork of the snapshot, timed from the define to an exec's answer; a
    restore QEMU refuses (a port another process took meanwhile) is tried again."""
    for attempt in range(3):
        try:
            return _raw_fork_once(conn, srv, side, work, key, n)
        except libvirt.libvirtError as exc:
            progress(f"raw fork {n} refused ({exc}); again")
            with contextlib.suppress(libvirt.libvirtError):
                _drop(conn, f"rift-bench-fork-{side.image}-{n}")
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _raw_fork_once(conn: libvirt.virConnect, srv: Server, side: Side, work: Path,
                   key: paramiko.PKey, n: int) -> tuple[str, float]:
    folder = srv.data_dir / "snapshots" / side.snapshot_id
    state = folder / "state"
    name = f"rift-bench-fork-{side.image}-{n}"
    port = _own_port()
    disk = None
    if (folder / "disk.qcow2").is_file():
        disk = work / f"{name}.qcow2"
        shutil.copyfile(folder / "disk.qcow2", disk)
    xml = fork_domain_xml(read_save_header(state).xml, name=name, uuid=str(uuid.uuid4()),
                          vm_id=f"bench-{n}", task_id="bench", disk=str(disk) if disk else None,
                          serial_log=str(work / f"{name}.log"), ssh_port=port)
    forked = work / f"{name}.save"
    write_fork(state, forked, xml)
    began = time.perf_counter()
    conn.defineXML(xml)
    conn.restore(str(forked))
    while True:  # QEMU takes the connection before the guest's server answers it
        try:
            transport = open_transport(port, key)
            try:
                exec_on(transport)
            finally:
                transport.close()
            break
        except (OSError, EOFError, paramiko.SSHException):
            time.sleep(0.01)
    return name, time.perf_counter() - began


def _drop(conn: libvirt.virConnect, name: str) -> None:
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        progress(f"{name} was gone before its drop")
        return
    if dom.isActive():
        dom.destroy()
    dom.undefine()


def floor_side(srv: Server, sides: list[Side], work: Path) -> None:
    conn = libvirt.open(REAL_URI)
    try:
        for side in sides:
            key = load_key(key_path(srv.data_dir / "keys", side.task_id))
            for n in range(SAMPLES):
                name, seconds = _raw_fork(conn, srv, side, work, key, n)
                side.floor_s.append(seconds)
                _drop(conn, name)
            results: list[tuple[str, float]] = []

            def one(n: int, side: Side = side, key: paramiko.PKey = key,
                    results: list[tuple[str, float]] = results) -> None:
                results.append(_raw_fork(libvirt.open(REAL_URI), srv, side, work, key, n))

            threads = [threading.Thread(target=one, args=(100 + n,)) for n in range(AT_ONCE)]
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            side.floor_four_s = time.perf_counter() - began
            for name, _ in results:
                _drop(conn, name)
            progress(f"{side.image}: raw floor {ms(p50(side.floor_s))}, "
                     f"{AT_ONCE} at once {ms(side.floor_four_s)}")
    finally:
        conn.close()


def fork_steps(srv: Server) -> dict[str, list[float]]:
    steps: dict[str, list[float]] = {}
    for line in log_lines(srv.log):
        if line.get("msg") in ("vm forked", "fork identity"):
            for key, value in line.items():
                if key.endswith("_ms"):
                    steps.setdefault(key.removesuffix("_ms"), []).append(float(value))
    return steps


def main() -> int:
    missing = real_vms_missing()
    if missing is not None:
        print(f"\n## forks through MCP: skipped, {missing}")
        return 0
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        cached_tiny()
        cached_debian()
    except pytest.skip.Exception as exc:
        print(f"\n## forks through MCP: skipped, {exc}")
        return 0
    began_load = load()
    with work_dir("rift-bench-forks-") as tmp:
        work = Path(tmp)
        proc, srv = start_real_server(work / "rift", debian=True,
                                      RIFT_VM_BOOT_TIMEOUT_S="300")
        try:
            sides = mcp_clients.run(lambda: rift_side(srv), limit_s=3600)
            steps = fork_steps(srv)
            progress(f"steps: { {k: p50(v) for k, v in steps.items()} }")
            try:
                floor_side(srv, sides, work)
            except libvirt.libvirtError as exc:
                progress(f"the raw floor failed: {exc}")
                for qemu_log in Path("/var/log/libvirt/qemu").glob("rift-bench-fork-*.log"):
                    progress(f"{qemu_log.name}: {qemu_log.read_text()[-600:]}")
                raise
        finally:
            _cleanup(srv, proc)
    rows = []
    for side in sides:
        target = "< 1.5 s" if side.image == "debian" else ""
        rows.append((side.image, str(side.memory_mib), ms(side.snapshot_s),
                     f"{side.snapshot_bytes / (1 << 20):.0f} MiB", str(len(side.exec_s)),
                     ms(p50(side.answer_s)), ms(p50(side.exec_s)), ms(max(side.exec_s)),
                     ms(p50(side.floor_s)), f"{p50(side.exec_s) / p50(side.floor_s):.2f}x",
                     ms(side.four_s), ms(side.floor_four_s),
                     f"{statistics.median(side.rss_mib):.0f} MiB", target))
    print_table(f"Forks through MCP (SDK client) against raw libvirt restoring the same "
                f"state, {REAL_URI} (load average {began_load} before, {load()} after)", rows,
                ("image", "MiB", "snapshot", "on disk", "n", "answer p50", "first exec p50",
                 "first exec max", "raw floor p50", "exec / floor", f"{AT_ONCE} at once",
                 f"raw {AT_ONCE} at once", "fork RSS", "target"))
    print("\nfirst exec: `rift_vm_fork` sent until the answer of the fork's first "
          "`rift_vm_exec true`; 4 at once: `count` 4 until all four answered one. Raw floor: "
          "the snapshot's state file re-headed for a new domain, define + restore, raw "
          "paramiko on a new connection until `true` answers (the disk copy before it).")
    print_table("The server's fork steps (`vm forked` and `fork identity` log lines), ms",
                [(step, str(len(v)), f"{p50(v):,.0f}", f"{min(v):,.0f}-{max(v):,.0f}")
                 for step, v in steps.items()], ("step", "n", "p50", "range"))
    return 0


def _cleanup(srv: Server, proc: subprocess.Popen[str]) -> None:
    stop_server(proc)
    for domain in our_domains(srv).values():
        remove_domain(domain.name)
    conn = libvirt.open(REAL_URI)
    try:
        for dom in conn.listAllDomains(0):
            if dom.name().startswith("rift-bench-fork-"):
                _drop(conn, dom.name())
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
