"""rift-code, the guest half of code contexts (SPEC §20; hypervisor/rift_code.py), run
here on the host by Debian's python3 as a guest's would run it: with Debian's
ipykernel and jupyter_client (python3-ipykernel, which scripts/setup.sh installs, as
the `python` image carries it) and with its own kernel, where a guest has no
ipykernel. State kept between runs, rich forms, streams, errors, counts, timeouts
that leave the context usable, a kernel that dies, and the caps."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "hypervisor" / "rift_code.py"
PYTHON = "/usr/bin/python3"  # Debian's, with python3-ipykernel
# The smallest PNG: one transparent pixel.
PIXEL = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000" "1f15c4890000000d49444154789c"
    "63000100000500010d0a2db40000000049454e44ae426082")).decode()


class Server:
    def __init__(self, backend: str, tmp: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        env = dict(os.environ, RIFT_CODE_BACKEND=backend, HOME=str(tmp))
        self.proc = subprocess.Popen([PYTHON, str(SCRIPT), "serve", str(self.port), "--default"],
                                     env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert self.call("GET", "/health")[0] == 200
                return
            except OSError:
                assert time.monotonic() < deadline, "rift-code did not listen"
                time.sleep(0.05)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, json.dumps(body or {}))
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read())
        finally:
            conn.close()

    def run(self, code: str, context_id: str = "default", timeout_s: float = 20) -> Any:
        self.runs = getattr(self, "runs", 0) + 1
        status, view = self.call("POST", "/runs", {
            "run_id": f"run_{self.runs}", "context_id": context_id, "code": code,
            "timeout_s": timeout_s, "wait_ms": 30_000})
        assert status == 200, view
        assert view["status"] != "running"
        return view


@pytest.fixture(scope="module", params=["ipykernel", "rift"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[Server]:
    if request.param == "ipykernel" and subprocess.run(
            [PYTHON, "-c", "import ipykernel, jupyter_client"], check=False).returncode:
        pytest.fail("Debian's python3-ipykernel is missing: scripts/setup.sh installs it")
    started = Server(request.param, tmp_path_factory.mktemp("code"))
    yield started
    started.proc.kill()
    started.proc.wait()


def test_a_context_keeps_its_state_and_answers_each_form(server: Server) -> None:
    assert server.run("x = 41")["execution"]["results"] == []
    answer = server.run("print('out'); import sys; print('err', file=sys.stderr); x + 1")
    execution = answer["execution"]
    assert answer["status"] == "ok"
    assert execution["stdout"] == "out\n"
    assert execution["stderr"] == "err\n"
    assert execution["results"] == [{"data": {"text/plain": "42"}, "is_main_result": True}]
    assert execution["execution_count"] == server.runs
    shown = server.run(
        "class Table:\n"
        "    def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\n"
        "    def _repr_markdown_(self): return '| 1 |'\n"
        "    def _repr_json_(self): return {'rows': [1]}\n"
        "    def _repr_svg_(self): return '<svg xmlns=\"http://www.w3.org/2000/svg\"/>'\n"
        "    def _repr_png_(self): import base64; return base64.b64decode(" + repr(PIXEL) + ")\n"
        "    def __repr__(self): return 'Table'\n"
        "display(Table())\nTable()")["execution"]["results"]
    assert [r["is_main_result"] for r in shown] == [False, True]
    for result in shown:
        assert result["data"] == {
            "text/plain": "Table", "text/html": "<table><tr><td>1</td></tr></table>",
            "text/markdown": "| 1 |", "application/json": {"rows": [1]},
            "image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg"/>', "image/png": PIXEL}


def test_an_error_has_its_name_value_and_traceback(server: Server) -> None:
    answer = server.run("def f():\n    return 1 / 0\nf()")
    error = answer["execution"]["error"]
    assert answer["status"] == "error"
    assert (error["name"], error["value"]) == ("ZeroDivisionError", "division by zero")
    assert "return 1 / 0" in error["traceback"]
    assert "rift_code.py" not in error["traceback"]
    assert "\x1b[" not in error["traceback"]


def test_a_timeout_interrupts_the_kernel_and_the_context_goes_on(server: Server) -> None:
    server.run("kept = 'still here'")
    began = time.monotonic()
    answer = server.run("import time\nwhile True: time.sleep(0.05)", timeout_s=1)
    assert answer["status"] == "timed_out"
    assert answer["execution"]["error"]["name"] == "KeyboardInterrupt"
    assert time.monotonic() - began < 8
    assert server.run("kept")["execution"]["results"][0]["data"]["text/plain"] == "'still here'"


def test_a_kernel_that_dies_says_so_and_the_next_run_has_a_new_one(server: Server) -> None:
    server.call("POST", "/contexts", {"id": "ctx_dies", "language": "python"})
    server.run("gone = 1", "ctx_dies")
    died = server.run("import os; os._exit(3)", "ctx_dies")
    assert died["status"] == "kernel_died"
    assert died["execution"]["error"]["name"] == "KernelDied"
    after = server.run("'gone' in globals()", "ctx_dies")
    assert after["status"] == "ok"
    assert after["execution"]["results"][0]["data"]["text/plain"] == "False"


def test_contexts_are_made_listed_restarted_and_deleted(server: Server, tmp_path: Path) -> None:
    status, made = server.call("POST", "/contexts", {"id": "ctx_cwd", "language": "python",
                                                     "cwd": str(tmp_path)})
    assert status == 200
    assert made["alive"]
    where = server.run("import os; os.getcwd()", "ctx_cwd")["execution"]["results"]
    assert where[0]["data"]["text/plain"] == repr(str(tmp_path))
    server.run("y = 1", "ctx_cwd")
    assert server.call("POST", "/contexts/ctx_cwd/restart")[0] == 200
    assert server.run("'y' in globals()", "ctx_cwd")["execution"]["results"][0]["data"][
        "text/plain"] == "False"
    ids = [c["id"] for c in server.call("GET", "/contexts")[1]]
    assert "ctx_cwd" in ids
    assert "default" in ids
    assert server.call("DELETE", "/contexts/ctx_cwd")[0] == 200
    status, missing = server.call("POST", "/runs", {"run_id": "r", "context_id": "ctx_cwd",
                                                    "code": "1", "timeout_s": 5})
    assert (status, missing["error"]) == (404, "context_not_found")


def test_output_over_a_mib_is_truncated_and_an_image_over_4_mib_is_left_out(
        server: Server) -> None:
    answer = server.run("print('x' * (2 << 20))")
    assert answer["execution"]["truncated"]
    assert len(answer["execution"]["stdout"]) == 1 << 20
    big = server.run(
        "class Big:\n"
        "    def _repr_png_(self): return b'\\x89PNG' + bytes(5 << 20)\n"
        "    def __repr__(self): return 'Big'\n"
        "Big()")["execution"]
    assert big["results"] == [{"data": {"text/plain": "Big"}, "is_main_result": True}]
    [omitted] = big["omitted"]
    assert omitted["mime"] == "image/png"
    assert omitted["bytes"] == (5 << 20) + 4


def test_e2bs_execute_streams_a_run_as_its_code_interpreter_reads_it(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/execute", json.dumps({"code": "print('hi')\n6 * 7"}))
    answer = conn.getresponse()
    lines = [json.loads(line) for line in answer.read().splitlines()]
    conn.close()
    assert answer.status == 200
    assert lines[0]["type"] == "stdout" and lines[0]["text"] == "hi\n"
    result = next(line for line in lines if line["type"] == "result")
    assert (result["text"], result["is_main_result"]) == ("42", True)
    assert lines[-2]["type"] == "number_of_executions" and lines[-2]["execution_count"] >= 1
    assert lines[-1] == {"type": "end_of_execution"}


def test_a_runs_parts_are_read_as_they_come_and_its_view_once_it_ended(server: Server) -> None:
    """`POST /runs` with `parts` and `GET /runs/ID?parts=K`: each answer comes as soon as
    the run has parts past K, `running` until it ended, then with its whole view; an
    interrupt naming another run leaves this one alone."""
    server.runs = getattr(server, "runs", 0) + 1
    run_id = f"run_parts{server.runs}"
    status, first = server.call("POST", "/runs", {
        "run_id": run_id, "context_id": "default", "timeout_s": 20, "wait_ms": 10_000,
        "parts": 0, "code": "import time\nprint('a', flush=True)\ntime.sleep(0.5)\n"
                            "print('b')\n7"})
    assert status == 200 and first["status"] == "running" and "execution" not in first
    assert first["parts"] == [{"type": "stdout", "text": "a\n", "timestamp": ANY}]
    assert server.call("POST", "/contexts/default/interrupt", {"run_id": "run_other"})[0] \
        == 200
    seen, parts, answer = first["parts_seen"], list(first["parts"]), first
    while "execution" not in answer:
        answer = server.call("GET", f"/runs/{run_id}?wait_ms=10000&parts={seen}")[1]
        assert answer["parts_seen"] == seen + len(answer["parts"])
        seen, parts = answer["parts_seen"], parts + answer["parts"]
    assert answer["status"] == "ok"
    assert {p["type"] for p in parts[:-1]} == {"stdout"} and parts[-1]["type"] == "result"
    assert "".join(p.get("text", "") for p in parts) == "a\nb\n"
    assert (parts[-1]["data"], parts[-1]["is_main_result"]) == ({"text/plain": "7"}, True)
    assert answer["execution"]["results"][0]["data"] == {"text/plain": "7"}


def test_a_runs_environment_is_its_own(server: Server) -> None:
    server.runs = getattr(server, "runs", 0) + 1
    status, view = server.call("POST", "/runs", {
        "run_id": f"run_env{server.runs}", "context_id": "default", "timeout_s": 20,
        "wait_ms": 30_000, "env": {"RIFT_TRY": "yes"},
        "code": "import os; os.environ.get('RIFT_TRY')"})
    assert status == 200 and view["execution"]["results"][0]["data"]["text/plain"] == "'yes'"
    after = server.run("import os; os.environ.get('RIFT_TRY')")["execution"]["results"]
    assert after == []  # None: no result, and no RIFT_TRY after its run


@pytest.mark.parametrize("backend", ["ipykernel", "rift"])
def test_health_waits_for_the_default_kernel_to_be_warm(backend: str, tmp_path: Path) -> None:
    # What a pool's fill asks before its VM is ready: handed out with the kernel warm.
    started = Server(backend, tmp_path)  # answered /health at once, the kernel starting
    try:
        status, health = started.call("GET", "/health?wait_ms=50000")
        assert (status, health["warm"], health["backend"]) == (200, True, backend)
        _, listed = started.call("GET", "/contexts")
        [default] = [c for c in listed if c["id"] == "default"]
        assert (default["alive"], default["backend"]) == (True, backend)
    finally:
        started.proc.kill()
        started.proc.wait()
