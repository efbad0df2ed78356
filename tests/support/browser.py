"""What the browser tests do besides driving Chromium: agents (the official MCP
SDK client, on a thread of their own so they never meet Playwright's event loop),
logging a page in, users with tokens, and a second replica behind one address."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from rift.catalog import StaticImages
from rift.domain.clock import SystemClock
from rift.services.access import accounts
from rift.services.context import Deps
from rift.store.sql import SqlStore
from tests.support.engine import FakePool
from tests.support.mcp_clients import call, mcp_session, run
from tests.support.servers import Server, free_port, stop_server

playwright_api = pytest.importorskip("playwright.sync_api")

T = TypeVar("T")


def in_thread(work: Callable[[], T], limit_s: float = 60) -> T:
    """Run blocking async client work on a thread of its own (its own event loop),
    so it never meets Playwright's; bounded."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result(timeout=limit_s)


class Agent:
    """An MCP client under one token, declaring one client name (its holder label)."""

    def __init__(self, url: str, token: str, name: str) -> None:
        self.url, self.token, self.name = url, token, name

    def call(self, tool: str, **args: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}

        async def scenario() -> None:
            async with mcp_session(self.url, self.token, name=self.name) as session:
                out.update(await call(session, tool, **args))

        in_thread(lambda: run(scenario))
        return out

    def calls(self, steps: Callable[[Any], Awaitable[None]]) -> None:
        async def scenario() -> None:
            async with mcp_session(self.url, self.token, name=self.name) as session:
                await steps(session)

        in_thread(lambda: run(scenario))


def log_in(page: Any, url: str, user: str, password: str) -> None:
    page.goto(url + "/login")
    page.fill("#user", user)
    page.fill("#password", password)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")
    playwright_api.expect(page.locator("#live-status")).to_have_attribute("data-state", "live")


def add_user(server: Server, name: str, password: str | None = None) -> str:
    """A user (with a password for the page, if given) and an API token for its
    agents: the engine calls `rift user add` and `rift token new` make, run here
    on the server's database (the command itself takes 2 s to start)."""
    store = SqlStore(f"sqlite:///{(server.data_dir / 'rift.db').resolve()}")
    deps = Deps(store=store, clock=SystemClock(), hosts=FakePool(), images=StaticImages([]))
    try:
        accounts.add_user(deps, name, password)
        return accounts.new_token(deps, name, f"{name}-laptop").token.value
    finally:
        store.close()


def start_replica(server: Server, log: Path) -> tuple[subprocess.Popen[str], str]:
    """A second `rift serve` on the same database, as a replica behind one address."""
    port = free_port()
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "rift.cli", "serve", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=sink, env=server.env,
                                text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    stop_server(proc)
    pytest.fail("the replica did not answer /healthz within 30 s")
