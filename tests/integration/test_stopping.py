"""`rift serve` stops within 10 s of SIGTERM whatever its calls are doing (SPEC §15):
a live page streaming forever, a worker thread stuck where no timeout reaches."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx

from tests.support.servers import free_port, start_server, stop_server

STOP_BOUND_S = 10.0


def _stopped_within(proc: subprocess.Popen[str], bound_s: float) -> float:
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=bound_s + 20)
    return time.monotonic() - began


def _open_live_stream(url: str, password: str, opened: threading.Event) -> None:
    origin = {"Origin": url}
    with httpx.Client(base_url=url, timeout=60) as client:
        page = client.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        login = client.post("/login", headers=origin, data={
            "user": "admin", "password": password, "csrf": csrf.group(1)})
        assert login.status_code == 303, login.text
        try:
            with client.stream("GET", "/live?v=0") as stream:
                assert stream.status_code == 200
                opened.set()
                for _ in stream.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass  # the server went away: what the test waits for
        finally:
            opened.set()


def test_serve_stops_promptly_while_a_live_page_streams(tmp_path: Path) -> None:
    proc, server = start_server(tmp_path)
    opened = threading.Event()
    reader = threading.Thread(target=_open_live_stream, args=(server.url, server.password,
                                                              opened), daemon=True)
    reader.start()
    assert opened.wait(30), "the live page did not open"
    try:
        took = _stopped_within(proc, STOP_BOUND_S)
    finally:
        stop_server(proc)
    assert took < STOP_BOUND_S, f"rift serve took {took:.1f} s to stop"


STUCK_APP = textwrap.dedent("""
    import contextlib, sys, threading
    import anyio, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from rift.api.serving import PromptServer

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        print("stopping", flush=True)
        # A shutdown step no timeout reaches (as the pool filler's join on a boot was).
        await anyio.to_thread.run_sync(threading.Event().wait)

    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("up"))],
                    lifespan=lifespan)
    config = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]),
                            log_level="warning", timeout_graceful_shutdown=1)
    PromptServer(config, stop_s=3.0).run()
""")


def test_a_shutdown_step_stuck_for_good_does_not_hold_the_stop() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", STUCK_APP, str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).text == "up":
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the app did not start"
            time.sleep(0.1)
        took = _stopped_within(proc, 3.0)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "stopping"
    finally:
        stop_server(proc)
    assert 3.0 <= took < 3.0 + 3.0, f"the stop took {took:.1f} s (watchdog at 3 s)"
