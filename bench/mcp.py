"""The MCP door's benchmarks (issue #3), against a real `rift serve`-style process
(one uvicorn worker, libvirt's test driver) on loopback:

1. an MCP tool call round trip (`rift_task_get` with a handle, the official SDK
   client, 2026-07-28, one session reused) against the floor of a bare FastAPI
   POST route making the same engine call (`rift.services.lifecycle.tasks.get`) with a
   reused httpx client; medians, p99 and the ratio (target: MCP at most 2x the
   floor's median). Interleaved blocks, so a noisy neighbour hits both alike;
2. tool calls per second with 16 concurrent SDK clients on the one worker.

The server runs in a child process (`python -m bench.mcp --serve PORT DIR`) so
that client and server do not share a GIL.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY

from bench.common import median_us, print_table, work_dir

CALLS = 2000
BLOCKS = 20
CONCURRENT = 16
CONCURRENT_S = 5.0
TARGET_RATIO = 2.0


# -- the server (child process) -------------------------------------------------------

def serve(port: int, data_dir: Path) -> None:
    """`create_app` as `rift serve` builds it, plus the floor route, on one worker."""
    import uvicorn
    from fastapi import Body

    from hypervisor import write_test_host_xml
    from rift.app import create_app
    from rift.bootstrap import build_deps, close_deps, ensure_admin
    from rift.config import Settings
    from rift.contract.tasks import TaskGetIn
    from rift.services.context import Caller
    from rift.services.lifecycle import tasks

    uri = write_test_host_xml(str(data_dir / "node.xml"), 64, 262144)
    settings = Settings(data_dir=data_dir, hypervisor_uri=uri, log_level="WARNING",
                        max_open_tasks=1000, rate_task_new_per_h=10**6)
    deps = build_deps(settings)
    first = ensure_admin(deps)
    assert first is not None
    app = create_app(settings, deps)
    floor_caller = Caller("admin", "mcp:bench")

    @app.post("/floor")
    def floor(handle: str = Body(embed=True)) -> dict[str, Any]:
        return tasks.get(deps, floor_caller, TaskGetIn(handle=handle)).model_dump(mode="json")

    print(first.token, flush=True)
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", workers=1)
    finally:
        close_deps(deps)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data_dir: Path, module: str = "bench.mcp", within_s: float = 30,
           ) -> tuple[subprocess.Popen[str], str, str]:
    """`python -m <module> --serve PORT DIR` (it prints the admin's token first),
    once its /healthz answers: (process, URL, token)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", module, "--serve", str(port),
                             str(data_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    token = proc.stdout.readline().strip()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url, token
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the benchmark server did not start within {within_s:.0f} s")


# -- the client -----------------------------------------------------------------------

@asynccontextmanager
async def _session(url: str, token: str, name: str,
                   legacy: bool = False) -> AsyncIterator[ClientSession]:
    info = types.Implementation(name=name, version="1")
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                   timeout=30) as http,
                streamable_http_client(url + "/mcp", http_client=http) as (read, write),
                ClientSession(read, write, client_info=info) as session):
        await (session.initialize() if legacy else session.discover())
        await session.list_tools()
        yield session


async def _new_handle(session: ClientSession) -> str:
    result = await session.call_tool("rift_task_new", {"name": "bench"})
    assert not result.is_error and isinstance(result.structured_content, dict)
    return str(result.structured_content["handle"])


async def _per_op(fn: Callable[[], Awaitable[object]], n: int, warmup: int = 20) -> list[float]:
    """`bench.common.per_op` for coroutines: seconds per awaited call."""
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return samples


def _p99_us(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] * 1e6


async def _round_trips(url: str, token: str) -> list[tuple[str, ...]]:
    mcp_samples: list[float] = []
    legacy_samples: list[float] = []
    raw_samples: list[float] = []
    floor_samples: list[float] = []
    async with (_session(url, token, "bench") as session,
                _session(url, token, "bench-legacy", legacy=True) as legacy,
                httpx.AsyncClient(base_url=url, timeout=30) as http):
        handle = await _new_handle(session)
        payload = json.dumps({"handle": handle})
        envelope = {PROTOCOL_VERSION_META_KEY: "2026-07-28",
                    CLIENT_CAPABILITIES_META_KEY: {},
                    CLIENT_INFO_META_KEY: {"name": "bench", "version": "1"}}
        rpc = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "rift_task_get", "arguments": {"handle": handle}, "_meta": envelope}})
        rpc_headers = {"Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28",
                       "Accept": "application/json, text/event-stream",
                       "Mcp-Method": "tools/call", "Mcp-Name": "rift_task_get",
                       "Authorization": f"Bearer {token}"}

        async def mcp_call() -> None:
            result = await session.call_tool("rift_task_get", {"handle": handle})
            assert not result.is_error

        async def legacy_call() -> None:
            result = await legacy.call_tool("rift_task_get", {"handle": handle})
            assert not result.is_error

        async def raw_call() -> None:
            answer = await http.post("/mcp", content=rpc, headers=rpc_headers)
            assert answer.status_code == 200 and '"isError":false' in answer.text

        async def floor_call() -> None:
            answer = await http.post("/floor", content=payload,
                                     headers={"Content-Type": "application/json"})
            assert answer.status_code == 200

        for _ in range(BLOCKS):
            mcp_samples += await _per_op(mcp_call, CALLS // BLOCKS)
            legacy_samples += await _per_op(legacy_call, CALLS // BLOCKS)
            raw_samples += await _per_op(raw_call, CALLS // BLOCKS)
            floor_samples += await _per_op(floor_call, CALLS // BLOCKS)
    mcp_us, floor_us = median_us(mcp_samples), median_us(floor_samples)
    ratio = mcp_us / floor_us
    return [
        ("MCP tools/call rift_task_get (SDK client, 2026-07-28)", f"{mcp_us:,.0f}",
         f"{_p99_us(mcp_samples):,.0f}", ""),
        ("MCP, the same call in the 2025-11-25 handshake era",
         f"{median_us(legacy_samples):,.0f}", f"{_p99_us(legacy_samples):,.0f}", ""),
        ("the same JSON-RPC POST from bare httpx (server side alone)",
         f"{median_us(raw_samples):,.0f}", f"{_p99_us(raw_samples):,.0f}", ""),
        ("floor: bare FastAPI POST, same engine call", f"{floor_us:,.0f}",
         f"{_p99_us(floor_samples):,.0f}", ""),
        (f"ratio MCP / floor (target <= {TARGET_RATIO:g})", f"{ratio:.2f}", "",
         "ok" if ratio <= TARGET_RATIO else "MISSED"),
    ]


async def _throughput(url: str, token: str) -> list[tuple[str, ...]]:
    done = [0] * CONCURRENT

    async def client(n: int, start: anyio.Event, stop_at: list[float]) -> None:
        async with _session(url, token, f"bench-{n}") as session:
            handle = await _new_handle(session)
            await start.wait()
            while time.perf_counter() < stop_at[0]:
                result = await session.call_tool("rift_task_get", {"handle": handle})
                assert not result.is_error
                done[n] += 1

    start, stop_at = anyio.Event(), [0.0]
    async with anyio.create_task_group() as tg:
        for n in range(CONCURRENT):
            tg.start_soon(client, n, start, stop_at)
        await anyio.sleep(1.0)  # every client connected and holding a task
        began = time.perf_counter()
        stop_at[0] = began + CONCURRENT_S
        start.set()
    elapsed = time.perf_counter() - began
    return [(f"{CONCURRENT} concurrent SDK clients, rift_task_get, one worker",
             f"{sum(done) / elapsed:,.0f}", f"{min(done)}–{max(done)} calls per client")]


def main() -> None:
    with work_dir() as tmp:
        proc, url, token = _start(Path(tmp))
        try:
            latency = anyio.run(_round_trips, url, token)
            rate = anyio.run(_throughput, url, token)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
            if proc.stdout is not None:
                proc.stdout.close()
    print_table("MCP round trip over loopback HTTP (one uvicorn worker)", latency,
                ("call", "median µs", "p99 µs", ""))
    print_table("MCP throughput", rate, ("load", "tool calls/s", "spread"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
