"""Chromium (Debian's `/usr/bin/chromium`, headless, driven by Playwright) against a
real `rift serve`; agents are the official MCP SDK client. Nothing is downloaded:
Playwright's Python package brings its driver, Debian brings the browser."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.servers import Server, start_server, stop_server

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
WAIT_MS = 10_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The e2e suite's module-scoped `rift serve` (as tests/e2e/conftest.py's)."""
    proc, srv = start_server(tmp_path_factory.mktemp("rift"))
    try:
        yield srv
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")  # Playwright holds an event loop in this thread while open
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM}: apt-get install chromium (scripts/setup.sh does)")
    playwright_api.expect.set_options(timeout=WAIT_MS)
    with playwright_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS,
                                      timeout=30_000)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  color_scheme="light")
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    try:
        yield opened
    finally:
        context.close()
