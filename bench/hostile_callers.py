"""Mallory's callers in bench/hostile.py: processes of their own, each on one MCP
session, calling `rift_vm_exec` on her VM while a hostile case runs."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator
from queue import Empty
from typing import Any

import anyio

from tests.support.mcp_clients import mcp_session

CALLERS = 2  # mallory's callers at once during a case
PACE_S = 0.25  # each caller's pause between calls (her guest is the attack, not her rate)


def _caller(url: str, token: str, args: dict[str, Any], stop: Any, ready: Any,
            answers: Any) -> None:
    """One of mallory's callers, in a process of its own (alice's probe is another
    client: it must not wait for this one's GIL), on one MCP session as an agent's
    client keeps it (a new session when a call breaks it): `rift_vm_exec` until
    `stop`, each answer's (code, seconds) put on `answers`. At nice 19: it stands for
    an agent's client on another machine, so its own client-side work (its MCP
    session, JSON) must not take this machine's cores from alice; what its calls
    make `rift serve` and mallory's guest do is still counted in full."""
    os.nice(19)

    async def calls() -> None:
        while not stop.is_set():
            try:
                async with mcp_session(url, token, "hostile") as session:
                    ready.set()  # its session open: the window may start
                    while not stop.is_set():
                        began = time.monotonic()
                        code: str | None = None
                        try:
                            with anyio.fail_after(90):
                                result = await session.call_tool("rift_vm_exec", dict(args))
                            if result.is_error:
                                content = result.structured_content or {}
                                code = str(content.get("error", {}).get("code"))
                        except TimeoutError:
                            code = "no_answer"
                        answers.put((code, time.monotonic() - began))
                        if code == "no_answer":
                            break  # the session may be stuck: a new one
                        await anyio.sleep(PACE_S)
            except Exception:  # a broken session: said, and a new one
                answers.put(("broken", 0.0))
                await anyio.sleep(PACE_S)

    anyio.run(calls)


@contextlib.contextmanager
def pressure(url: str, token: str, args: dict[str, Any]) -> Iterator[list[tuple[str | None,
                                                                               float]]]:
    """CALLERS processes calling `rift_vm_exec` with `args` (on mallory's VM) until
    the block ends (and the calls in flight then have answered); the block starts
    once each has its session open (a client's start-up is not her guest's doing)."""
    spawn = multiprocessing.get_context("spawn")
    stop, queue = spawn.Event(), spawn.Queue()
    readies = [spawn.Event() for _ in range(CALLERS)]
    procs = [spawn.Process(target=_caller, daemon=True, args=(
        url, token, args, stop, ready, queue)) for ready in readies]
    for proc in procs:
        proc.start()
    for ready in readies:
        ready.wait(60)
    answers: list[tuple[str | None, float]] = []
    try:
        yield answers
    finally:
        stop.set()
        for proc in procs:  # the calls in flight end within their deadline
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        while True:
            try:
                answers.append(queue.get(timeout=1))
            except Empty:
                break
