"""Code contexts at the doors (SPEC §20): `rift_vm_run_code` over MCP answers a chart
(a PNG, an SVG) also as image content after its text, and REST's `POST
/vms/{id}/code` and the context routes make the same calls; both over the real
rift-code run on this host (tests/support/code_guest.py); and E2B's code
interpreter SDK hears a run's output as it comes."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.testclient import TestClient

from rift.app import create_app
from rift.config import Settings
from rift.services.access import accounts
from rift.services.context import Deps
from tests.support.code_guest import HostCode
from tests.support.e2b import e2b_opts
from tests.support.fake_guest import fake_guests
from tests.support.raw_mcp import RawMcp, call_tool
from tests.support.servers import free_port
from tests.support.vm_rows import give_ssh_address

PIXEL = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000" "1f15c4890000000d49444154789c"
    "63000100000500010d0a2db40000000049454e44ae426082")).decode()
SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'


def _tasks_rpc(client: TestClient, token: str, method: str, params: dict[str, Any]) -> Any:
    """One 2026-07-28 request of a client that declares MCP Tasks: its result."""
    raw = RawMcp("", token, declare_tasks=True)
    answer = client.post("/mcp", headers=raw.headers(method, params),
                         json=raw.body(method, params))
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("application/json"):
        return answer.json()["result"]
    return next(json.loads(line[5:]) for line in answer.text.splitlines()
                if line.startswith("data:") and len(line) > 6)["result"]


class Served:
    """The app under uvicorn on a loopback port, in a thread of this process (the
    SDKs speak HTTP to a server, not to a test client)."""

    def __init__(self, deps: Deps, settings: Settings) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.server = uvicorn.Server(uvicorn.Config(
            create_app(settings, deps), host="127.0.0.1",
            port=int(self.url.rsplit(":", 1)[1]), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the app did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def guest(tmp_path: Path) -> Iterator[HostCode]:
    started = HostCode(tmp_path)
    yield started
    started.close()


def test_a_chart_comes_as_image_content_on_mcp_and_rest_makes_the_same_calls(
        deps: Deps, guest: HostCode, tmp_path: Path) -> None:
    deps = replace(deps, guests=fake_guests(), code=guest)
    accounts.add_user(deps, "ada", "correct horse battery")
    token = accounts.new_token(deps, "ada").token.value
    settings = Settings(data_dir=tmp_path, hypervisor_uri="fake:///local")
    with TestClient(create_app(settings, deps), base_url="http://127.0.0.1") as client:
        rest = {"Authorization": f"Bearer {token}"}
        made = client.post("/api/v1/tasks", headers=rest, json={}).json()
        handle = made["handle"]
        held = rest | {"Rift-Handle": handle}
        vm_id = client.post(f"/api/v1/tasks/{made['task']['id']}/vms", headers=held,
                            json={}).json()["vm"]["id"]
        with deps.store.write() as tx:
            give_ssh_address(tx, vm_id)
        chart = (
            "class Chart:\n"
            f"    def _repr_png_(self): import base64; return base64.b64decode({PIXEL!r})\n"
            "class Drawing:\n"
            f"    def _repr_svg_(self): return {SVG!r}\n"
            "display(Drawing())\nprint('drawn')\nChart()")
        result = call_tool(client, token, "rift_vm_run_code",
                      {"handle": handle, "vm_id": vm_id, "code": chart})
        assert result["isError"] is False
        text, svg, png = result["content"]
        assert text["type"] == "text" and "drawn" in text["text"]
        assert (svg["type"], svg["mimeType"]) == ("image", "image/svg+xml")
        assert base64.b64decode(svg["data"]).decode() == SVG
        assert (png["type"], png["mimeType"], png["data"]) == ("image", "image/png", PIXEL)
        execution = result["structuredContent"]["execution"]
        assert execution["results"][1]["data"]["image/png"] == PIXEL

        ran = client.post(f"/api/v1/vms/{vm_id}/code", headers=held,
                          json={"code": "answer = 6 * 7\nanswer"})
        assert ran.status_code == 200, ran.text
        assert ran.json()["execution"]["results"][0]["data"] == {"text/plain": "42"}
        run_id = ran.json()["execution"]["run_id"]
        again = client.get(f"/api/v1/vms/{vm_id}/code/runs/{run_id}?wait_s=1", headers=held)
        assert again.status_code == 200, again.text
        assert again.json()["execution"]["results"][0]["data"] == {"text/plain": "42"}
        new = client.post(f"/api/v1/vms/{vm_id}/code/contexts", headers=held,
                          json={"cwd": str(tmp_path)})
        assert new.status_code == 201, new.text
        context_id = new.json()["context"]["id"]
        listed = client.get(f"/api/v1/vms/{vm_id}/code/contexts", headers=held).json()
        assert context_id in [x["id"] for x in listed["contexts"]]
        assert client.post(f"/api/v1/vms/{vm_id}/code/contexts/{context_id}/restart",
                           headers=held).status_code == 200
        assert client.delete(f"/api/v1/vms/{vm_id}/code/contexts/{context_id}",
                             headers=held).status_code == 200
        gone = client.post(f"/api/v1/vms/{vm_id}/code", headers=held,
                           json={"code": "1", "context_id": context_id})
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "context_not_found"
        bad = client.post(f"/api/v1/vms/{vm_id}/code", headers=held,
                          json={"code": "1", "language": "cobol"})
        assert bad.status_code == 422
        assert bad.json()["error"]["field"] == "language"
        assert "python" in bad.json()["error"]["message"]


def test_a_long_run_is_an_mcp_task_whose_cancel_interrupts_the_kernel(
        deps: Deps, guest: HostCode, tmp_path: Path) -> None:
    """A run that outlasts a second answers a task (SPEC §10 for run_code, §20);
    `tasks/get` says it is working, `tasks/cancel` interrupts the kernel, and the
    context goes on with its state."""
    deps = replace(deps, guests=fake_guests(), code=guest)
    accounts.add_user(deps, "ada", "correct horse battery")
    token = accounts.new_token(deps, "ada").token.value
    settings = Settings(data_dir=tmp_path, hypervisor_uri="fake:///local")
    with TestClient(create_app(settings, deps), base_url="http://127.0.0.1") as client:
        rest = {"Authorization": f"Bearer {token}"}
        made = client.post("/api/v1/tasks", headers=rest, json={}).json()
        handle = made["handle"]
        vm_id = client.post(f"/api/v1/tasks/{made['task']['id']}/vms",
                            headers=rest | {"Rift-Handle": handle}, json={}).json()["vm"]["id"]
        with deps.store.write() as tx:
            give_ssh_address(tx, vm_id)
        args = {"handle": handle, "vm_id": vm_id}
        call_tool(client, token, "rift_vm_run_code", {**args, "code": "kept = 'yes'"})
        task = _tasks_rpc(client, token, "tools/call", {
            "name": "rift_vm_run_code",
            "arguments": {**args, "code": "import time\nwhile True: time.sleep(0.05)"}})
        assert task["resultType"] == "task", task
        got = _tasks_rpc(client, token, "tasks/get", {"taskId": task["taskId"]})
        assert got["status"] == "working", got
        _tasks_rpc(client, token, "tasks/cancel", {"taskId": task["taskId"]})
        after = call_tool(client, token, "rift_vm_run_code", {**args, "code": "kept"})
        execution = after["structuredContent"]["execution"]
        assert execution["results"][0]["data"]["text/plain"] == "'yes'", execution
        got = _tasks_rpc(client, token, "tasks/get", {"taskId": task["taskId"]})
        assert got["status"] == "cancelled", got


def test_e2bs_sdk_hears_a_runs_output_as_the_kernel_makes_it(
        deps: Deps, guest: HostCode, tmp_path: Path) -> None:
    """E2B's code interpreter SDK's `run_code(on_stdout=…)` (SPEC §20) through the door,
    over real HTTP: a cell that prints, sleeps a second and prints again is heard line
    by line, the first before the cell ends; its result and count come after."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    deps = replace(deps, guests=fake_guests(), code=guest)
    accounts.add_user(deps, "ada", "correct horse battery")
    token = accounts.new_token(deps, "ada").token.value
    served = Served(deps, Settings(data_dir=tmp_path, hypervisor_uri="fake:///local"))
    try:
        sbx = CodeSandbox.create(template="base", **e2b_opts(served.url, token))
        with deps.store.write() as tx:
            give_ssh_address(tx, f"vm_{sbx.sandbox_id}")
        heard: list[tuple[float, str]] = []
        ran = sbx.run_code("import time\nprint('first', flush=True)\ntime.sleep(1)\n"
                           "print('second')\n6 * 7",
                           on_stdout=lambda out: heard.append((time.monotonic(), out.line)))
        ended = time.monotonic()
        assert [line for _at, line in heard] == ["first\n", "second\n"]
        assert ended - heard[0][0] >= 0.8, "the first line came only at the end"
        assert (ran.text, ran.logs.stdout, ran.error) == ("42", ["first\n", "second\n"], None)
        assert ran.execution_count is not None
    finally:
        served.stop()
