"""Hosts elsewhere (issue #16): a real `rift serve` on qemu:///system with two
hypervisor hosts made on this machine by scripts/netns-hosts.sh (each its own
network and mount namespace, libvirtd and sshd), driven by the MCP SDK client:

1. exec round trip (`true`) to a `tiny` guest on this machine's host against the
   same on a host elsewhere (reached through that host's SSH, `direct-tcpip`),
   interleaved blocks, medians and the ratio;
2. file throughput: a 4 MiB `rift_vm_write_file` and `rift_vm_read_file` to each;
3. live migration of a 512 MiB `debian` VM from one host elsewhere to the other
   (`rift host drain --move`): the whole command, and the migration itself (the
   `vm_moved` event's `ms`).
4. hand-out from pools: `rift_vm_new` taking a `tiny` VM from a running pool and
   from a saved pool (restored on hand-out) on this machine's host against the
   same on a host elsewhere, ROUNDS rounds in alternating order (each pool
   refilled in between): the VM view's `start.ms` and the call seen by the client.

Needs root, libvirtd (scripts/libvirt.sh) and the cached `tiny` and `debian`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, use_test_cache, work_dir

use_test_cache()

from tests.support import mcp_clients  # noqa: E402 (after the cache is chosen)
from tests.support.servers import (  # noqa: E402
    Server,
    real_vms_missing,
    start_real_server,
    stop_server,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "netns-hosts.sh"
HOSTS = (21, 22)
BLOCKS, PER_BLOCK = 6, 10
FILE_MIB = 4
ROUNDS = 5
# One size per pool, so each `rift_vm_new` is answered by the pool it asks for.
POOLS = {("running", "local"): 256, ("running", "far"): 288,
         ("saved", "local"): 320, ("saved", "far"): 352}


def _progress(text: str) -> None:
    print(f"[hosts] {text}", flush=True)


def _rift(srv: Server, *argv: str) -> subprocess.CompletedProcess[str]:
    done = srv.rift(*argv)
    if done.returncode != 0:
        raise RuntimeError(f"rift {' '.join(argv)}: {done.stderr.strip()}")
    return done


async def _measure(srv: Server) -> dict[str, Any]:
    call = mcp_clients.call
    out: dict[str, Any] = {}
    async with mcp_clients.mcp_session(srv.url, srv.token) as s:
        handle = (await call(s, "rift_task_new", name="bench-hosts"))["handle"]
        here = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]
        _rift(srv, "host", "undrain", f"hv{HOSTS[0]}")
        _rift(srv, "host", "drain", "local")
        far = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]
        assert (here["host"], far["host"]) == ("local", f"hv{HOSTS[0]}"), (here, far)
        _progress(f"tiny on local ({here['id']}) and on hv{HOSTS[0]} ({far['id']})")
        trips: dict[str, list[float]] = {"local": [], "far": []}
        order = [("local", here), ("far", far)]
        for block in range(BLOCKS):
            for name, vm in (order if block % 2 == 0 else order[::-1]):
                for _ in range(PER_BLOCK):
                    started = time.perf_counter()
                    await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"], command="true")
                    trips[name].append(time.perf_counter() - started)
        out["trips"] = trips
        blob = base64.b64encode(os.urandom(FILE_MIB << 20)).decode()
        files: dict[str, tuple[float, float]] = {}
        for name, vm in order:
            started = time.perf_counter()
            await call(s, "rift_vm_write_file", handle=handle, vm_id=vm["id"], path="/root/blob",
                       content=blob, encoding="base64")
            wrote = time.perf_counter() - started
            started = time.perf_counter()
            got = await call(s, "rift_vm_read_file", handle=handle, vm_id=vm["id"],
                             path="/root/blob", encoding="base64")
            read = time.perf_counter() - started
            assert got["bytes"] == FILE_MIB << 20, got["bytes"]
            files[name] = (wrote, read)
        out["files"] = files
        await call(s, "rift_vm_destroy", handle=handle, vm_id=far["id"])  # it alone moves
        _progress("a debian VM (512 MiB) on the first host, to move to the second")
        full = (await call(s, "rift_vm_new", handle=handle, image="debian"))["vm"]
        assert full["host"] == f"hv{HOSTS[0]}", full
        await call(s, "rift_vm_exec", handle=handle, vm_id=full["id"], command="true")
        _rift(srv, "host", "undrain", f"hv{HOSTS[1]}")
        started = time.perf_counter()
        moved = srv.rift("host", "drain", f"hv{HOSTS[0]}", "--move")
        out["move_s"] = time.perf_counter() - started
        out["move_said"] = moved.stdout + moved.stderr
        after = (await call(s, "rift_vm_exec", handle=handle, vm_id=full["id"],
                            command="echo still here"))["stdout"]
        assert after == "still here\n", after
        task_id = (await call(s, "rift_vm_get", vm_id=full["id"]))["vm"]["task_id"]
        out["moved"], after_id = [], 0
        while True:
            page = await call(s, "rift_task_events", task_id=task_id, after_id=after_id,
                              limit=100)
            out["moved"] += [e["details"] for e in page["events"] if e["type"] == "vm_moved"]
            if not page["has_more"]:
                break
            after_id = page["next_after"]
        await call(s, "rift_task_close", handle=handle)
    out["handouts"] = await _handouts(srv)
    return out


def _pools_ready(srv: Server) -> bool:
    rows = json.loads(_rift(srv, "pool", "list", "--json").stdout)
    return bool(rows) and all(row[goal]["ready"] >= row[goal]["want"]
                              for row in rows for goal in ("running", "saved"))


async def _handouts(srv: Server) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Pools of `tiny` on `local` and on the second host elsewhere (the first is
    drained by the move): (start.ms, the call's ms) of each hand-out."""
    import anyio

    call = mcp_clients.call
    far = f"hv{HOSTS[1]}"
    _rift(srv, "host", "undrain", "local")
    for (goal, where), memory in POOLS.items():
        _rift(srv, "pool", "set", "tiny", f"--{goal}", "1", "--memory-mib", str(memory),
              "--host", "local" if where == "local" else far)
    took: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in POOLS}
    async with mcp_clients.mcp_session(srv.url, srv.token) as s:
        for n in range(ROUNDS):
            deadline = time.monotonic() + 300
            while not _pools_ready(srv):
                if time.monotonic() > deadline:
                    raise RuntimeError("the pools were not refilled in 300 s")
                await anyio.sleep(0.5)
            _progress(f"hand-outs, round {n + 1} of {ROUNDS}")
            handle = (await call(s, "rift_task_new", name=f"bench-pools-{n}"))["handle"]
            keys = list(POOLS) if n % 2 == 0 else list(POOLS)[::-1]
            for key in keys:
                started = time.perf_counter()
                vm = (await call(s, "rift_vm_new", handle=handle, image="tiny",
                                 memory_mib=POOLS[key]))["vm"]
                wall = (time.perf_counter() - started) * 1000
                want = {"running": "pool", "saved": "restore"}[key[0]]
                assert vm["start"]["kind"] == want, (key, vm)
                assert vm["host"] == ("local" if key[1] == "local" else far), (key, vm)
                took[key].append((float(vm["start"]["ms"]), wall))
            await call(s, "rift_task_close", handle=handle)
    _rift(srv, "pool", "clear", "tiny")
    return took


def main() -> int:
    missing = real_vms_missing()
    if missing is not None or os.geteuid() != 0:
        print(f"\n## hosts elsewhere: skipped, {missing or 'needs root'}")
        return 0
    folder = Path(f"/var/lib/rift-hosts/bench-{os.getpid()}")
    env = {**os.environ, "RIFT_HOSTS_DIR": str(folder)}
    uris = {}
    try:
        for n in HOSTS:
            subprocess.run([str(SCRIPT), "up", str(n)], env=env, check=True)
            uris[n] = subprocess.run([str(SCRIPT), "uri", str(n)], env=env, check=True,
                                     capture_output=True, text=True).stdout.strip()
        with work_dir("rift-bench-hosts-") as tmp:
            proc, srv = start_real_server(Path(tmp), debian=True)
            try:
                for n, uri in uris.items():
                    _rift(srv, "host", "add", f"hv{n}", uri)
                    _rift(srv, "host", "drain", f"hv{n}")
                out = mcp_clients.run(lambda: _measure(srv), limit_s=1800)
            finally:
                stop_server(proc)
    finally:
        for n in HOSTS:
            subprocess.run([str(SCRIPT), "down", str(n)], env=env, check=False,
                           capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
    _report(out)
    return 0


def _report(out: dict[str, Any]) -> None:
    trips = out["trips"]
    local, far = (statistics.median(trips[k]) * 1000 for k in ("local", "far"))
    print_table(f"exec round trip (`true`) to `tiny`, medians of {len(trips['local'])}", [
        ("this machine's host (qemu:///system)", f"{local:.1f}", "1.00x"),
        ("a host elsewhere (qemu+ssh, through its SSH)", f"{far:.1f}", f"{far / local:.2f}x"),
    ], ("host", "ms", "ratio"))
    rows = []
    for name, label in (("local", "this machine's host"), ("far", "a host elsewhere")):
        wrote, read = out["files"][name]
        rows.append((label, f"{FILE_MIB / wrote:.1f}", f"{FILE_MIB / read:.1f}"))
    print_table(f"file throughput ({FILE_MIB} MiB, base64 through MCP)", rows,
                ("host", "write MiB/s", "read MiB/s"))
    moved = out["moved"]
    print_table("live migration of a 512 MiB `debian` VM between hosts elsewhere (TCG)", [
        ("rift host drain --move (the command)", f"{out['move_s'] * 1000:,.0f}"),
        ("the migration (vm_moved's ms)", f"{moved[0]['ms']:,}" if moved else "—"),
    ], ("what", "ms"))
    rows = []
    for goal in ("running", "saved"):
        base = statistics.median(ms for ms, _ in out["handouts"][(goal, "local")])
        for where, label in (("local", "this machine's host"), ("far", "a host elsewhere")):
            taken = out["handouts"][(goal, where)]
            start = statistics.median(ms for ms, _ in taken)
            wall = statistics.median(w for _, w in taken)
            rows.append((f"{goal} pool, {label}", f"{start:.0f}", f"{wall:.0f}",
                         f"{start / base:.2f}x"))
    print_table(f"hand-out of `tiny` from a pool, medians of {ROUNDS}", rows,
                ("pool", "start.ms", "call ms", "ratio"))
    print(json.dumps({"move_said": out["move_said"].strip()}))


if __name__ == "__main__":
    main()
