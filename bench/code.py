"""Code contexts' benchmarks (issue #32, SPEC §20), on qemu:///system against a
`rift serve`-style child process, through the official MCP SDK client, on the
`python` image (ipykernel, numpy, pandas, matplotlib) as `rift image build python`
makes it from its recipe, cached machine-wide beside the tests' `debian`
(tests.support.servers.cached_python: built first when it is missing or its
recipe, its .debs or `debian` changed, about 12 minutes under TCG):

1. `rift_vm_run_code("1+1")` round trip against `rift_vm_exec` of `python3 -c 1+1`
   on the same VM, interleaved, medians (goal: at most 0.5x: the kernel is warm);
2. the first `run_code` after a pool's hand-out (a running pool of one, whose
   default context's kernel was started at its fill) against the later ones on the
   same VM, HAND_OUTS hand-outs (the pool refills between them), medians of each
   (goal: at most 1.5x);
3. a matplotlib line chart to PNG, round trip.

Needs libvirtd on qemu:///system (scripts/libvirt.sh).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession

from bench.common import print_table
from bench.execs import against_server, serve_real
from bench.mcp import _session

URI = "qemu:///system"
IMAGE = "python"
ROUNDS = 7
HAND_OUTS = 3
CHART = ("import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3))\n"
         "plt.plot([1, 2, 3, 4], [1, 4, 9, 16])\nplt.show()")


def serve(port: int, data_dir: Path) -> None:
    from tests.support.servers import cached_debian, cached_python

    serve_real(port, data_dir, {"debian": cached_debian(), IMAGE: cached_python()}, IMAGE,
               vm_boot_timeout_s=180)


async def _call(s: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    result = await s.call_tool(tool, args)
    assert not result.is_error and isinstance(result.structured_content, dict), result.content
    return result.structured_content


async def _timed(s: ClientSession, tool: str, **args: Any) -> float:
    began = time.perf_counter()
    await _call(s, tool, **args)
    return time.perf_counter() - began


async def _run(url: str, token: str, data_dir: Path) -> None:
    image = IMAGE  # its VMs' sizes are the image's (its saved state's)
    rows: list[tuple[str, ...]] = []
    async with _session(url, token, "bench-code") as s:
        handle = (await _call(s, "rift_task_new", name="bench code"))["handle"]
        vm = (await _call(s, "rift_vm_new", handle=handle, image=image))["vm"]
        first = await _timed(s, "rift_vm_run_code", handle=handle, vm_id=vm["id"], code="0",
                             wait_s=600)
        codes, execs = [], []
        for _ in range(ROUNDS):
            codes.append(await _timed(s, "rift_vm_run_code", handle=handle, vm_id=vm["id"],
                                      code="1+1"))
            execs.append(await _timed(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                      command="python3 -c 1+1"))
        code_ms, exec_ms = statistics.median(codes) * 1000, statistics.median(execs) * 1000
        rows.append(("run_code 1+1 / exec python3 -c 1+1", f"{code_ms:.0f} ms",
                     f"{exec_ms:.0f} ms", f"{code_ms / exec_ms:.2f}x (goal <= 0.5x)"))
        rows.append(("first run_code on a new VM (server and kernel start)",
                     f"{first * 1000:.0f} ms", "", ""))
        charts = [await _timed(s, "rift_vm_run_code", handle=handle, vm_id=vm["id"],
                               code=CHART, wait_s=600) for _ in range(3)]
        rows.append(("matplotlib line chart to PNG: first (import), later median",
                     f"{charts[0] * 1000:.0f} ms", f"{statistics.median(charts[1:]) * 1000:.0f}"
                     " ms", ""))
        await _call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
    pooled = await _pooled(url, token, data_dir, image)
    if pooled is not None:
        firsts, laters = pooled
        first, later = statistics.median(firsts), statistics.median(laters)
        rows.append((f"first run_code after a pool hand-out / a later one ({len(firsts)} "
                     "hand-outs, medians)", f"{first * 1000:.0f} ms", f"{later * 1000:.0f} ms",
                     f"{first / later:.2f}x (goal <= 1.5x)"))
        print("each hand-out's first run_code, then the median of its later ones: " + ", ".join(
            f"{f * 1000:.0f} / {la * 1000:.0f} ms" for f, la in zip(firsts, laters, strict=True)))
    print_table(f"code contexts on {image} (TCG or KVM as this host runs guests)", rows,
                ("what", "this", "against", "ratio"))


async def _one_plus_one(s: ClientSession, handle: str, vm_id: str) -> tuple[float, int]:
    """One `run_code("1+1")`: its round trip, and the run's own `duration_ms` in the
    guest (from its start in the kernel to its end)."""
    began = time.perf_counter()
    done = await _call(s, "rift_vm_run_code", handle=handle, vm_id=vm_id, code="1+1")
    return time.perf_counter() - began, int(done["execution"]["duration_ms"])


async def _pooled(url: str, token: str, data_dir: Path,
                  image: str) -> tuple[list[float], list[float]] | None:
    """For each of HAND_OUTS hand-outs from a running pool of one `image` VM (its
    kernel started at its fill): the first run_code, and the median of later ones."""
    import subprocess

    made = subprocess.run([sys.executable, "-m", "rift.cli", "pool", "set", image, "--running",
                           "1"], check=False,
                          env={**os.environ, "RIFT_DATA_DIR": str(data_dir),
                               "RIFT_HYPERVISOR_URI": URI}, capture_output=True, text=True)
    if made.returncode != 0:
        print(f"(no pool: {made.stderr.strip()})")
        return None
    firsts, laters = [], []
    async with _session(url, token, "bench-code-pool") as s:
        handle = (await _call(s, "rift_task_new", name="bench code pool"))["handle"]
        for _ in range(HAND_OUTS):
            deadline = time.monotonic() + 600
            while True:  # until the filler has one ready (a hand-out answers `pool`)
                vm = (await _call(s, "rift_vm_new", handle=handle, image=image))["vm"]
                if vm["start"]["kind"] == "pool":
                    break
                await _call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
                assert time.monotonic() < deadline, "the pool did not fill"
                time.sleep(20)
            first, first_guest = await _one_plus_one(s, handle, vm["id"])
            later = [await _one_plus_one(s, handle, vm["id"]) for _ in range(ROUNDS)]
            firsts.append(first)
            laters.append(statistics.median(took for took, _ in later))
            print(f"hand-out: the kernel's own time (the run's duration_ms) first {first_guest}"
                  f" ms, after {statistics.median(guest for _, guest in later)} ms")
            await _call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
        await _call(s, "rift_task_close", handle=handle)
    return firsts, laters


def main() -> None:
    from tests.support.servers import cached_python

    cached_python()  # built here, before the server's child (its start is bounded)
    against_server("code", _run, "bench.code")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
