"""Calls that wait, on real `tiny` guests (SPEC §10): progress on plain calls (the
SDK's client, both eras), MCP Tasks of 2026-07-28 and 2025-11-25 (bare JSON-RPC:
the SDK's client speaks neither), `subscriptions/listen` with `notifications/tasks`,
cancels (a task's, a closed stream's, `notifications/cancelled`; not a bare
disconnect in the handshake era; not under a lease that moved on), `rift_vm_new`
as a task, a call in flight keeping its lease active under short clocks, and
`GET /execs/{id}/stream`."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.js_clients import call_tool
from tests.support.mcp_clients import MODERN, mcp_session, refused, run
from tests.support.raw_mcp import LEGACY, RawMcp
from tests.support.real_guests import Guest, RealSettings, Rig
from tests.support.servers import Server, real_vms_missing, wait_until
from tests.support.soak import long_form

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

QUIET_S = 6  # RIFT_LEASE_QUIET_S here: a lease without calls goes quiet this soon


REAL = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": "120", "RIFT_SWEEP_INTERVAL_S": "2",
                         "RIFT_LEASE_QUIET_S": str(QUIET_S), "RIFT_ACTIVITY_STEP_S": "2"})


@pytest.fixture
def vm(tiny: Guest) -> tuple[str, str]:
    """A task with a running `tiny` VM, (handle, vm_id): the module's warm one."""
    return tiny.handle, tiny.vm_id


def tool(m: RawMcp, name: str, arguments: dict[str, Any], timeout_s: float = 120,
         ) -> dict[str, Any]:
    """A plain call that must succeed (no task: its answer is the result)."""
    answer = m.call(name, arguments)
    assert answer.error is None and answer.result is not None, answer
    if answer.result.get("resultType") == "task":
        answer.result = until_done(m, answer.result["taskId"], timeout_s)["result"]
    assert answer.result is not None and not answer.result.get("isError"), answer.result
    out: dict[str, Any] = answer.result["structuredContent"]
    return out


def until_done(m: RawMcp, task_id: str, within_s: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        got = m.request("tasks/get", {"taskId": task_id})
        assert got.error is None, got.error
        assert got.result is not None
        return got.result if got.result["status"] != "working" else None
    return wait_until(done, within_s, f"task {task_id} to end")


def acked(result: dict[str, Any]) -> bool:
    """An empty 2026-07-28 answer (the server's `_meta` aside)."""
    return {k: v for k, v in result.items() if k != "_meta"} == {"resultType": "complete"}


def exec_status(m: RawMcp, handle: str, exec_id: str) -> str:
    return str(tool(m, "rift_vm_exec_get", {"handle": handle, "exec_id": exec_id})["status"])


def test_a_plain_call_sends_progress_with_the_newest_line(real: Server,
                                                          vm: tuple[str, str]) -> None:
    handle, vm_id = vm

    async def scenario(era: str) -> list[tuple[float, float | None, str | None]]:
        heard: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None,
                              message: str | None) -> None:
            heard.append((progress, total, message))

        args: dict[str, Any] = {"handle": handle, "vm_id": vm_id, "wait_s": 30,
                                "command": "echo step 1; sleep 3; echo step 2; sleep 4"}
        async with mcp_session(real.url, real.token, era=era) as s:
            result = await s.call_tool("rift_vm_exec", args, progress_callback=on_progress)
        out = result.structured_content
        assert out is not None and out["status"] == "exited", out
        assert out["stdout"] == "step 1\nstep 2\n"
        return heard

    for era in (MODERN, "2025-11-25"):
        heard = run(lambda era=era: scenario(era))  # type: ignore[misc]
        assert len(heard) >= 2, (era, heard)  # after 1 s, then every 5 s, over about 7 s
        assert all(total == 30 for _, total, _ in heard), heard
        assert [v for v, _, _ in heard] == sorted(v for v, _, _ in heard)
        assert any(message and message.endswith("step 2") for _, _, message in heard), heard


def test_a_2026_task_runs_reports_and_answers_its_result(real: Server,
                                                         vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    m = RawMcp(real.url, real.token)
    quick = m.call("rift_vm_exec", {"handle": handle, "vm_id": vm_id, "command": "echo hi"})
    assert quick.result is not None and quick.result.get("resultType") == "complete", quick
    assert quick.result["structuredContent"]["stdout"] == "hi\n"

    slow = m.call("rift_vm_exec", {"handle": handle, "vm_id": vm_id,
                                   "command": "echo half; sleep 7; echo whole"})
    task = slow.result
    assert task is not None and task["resultType"] == "task", slow
    assert task["status"] == "working" and task["ttlMs"] > 0 and task["pollIntervalMs"] > 0
    assert len(task["taskId"]) >= 22 and "result" not in task  # at least 128 random bits
    seen = wait_until(lambda: _news(m, task["taskId"], "half"), 20, "the newest line")
    assert seen["status"] == "working" and seen["statusMessage"].endswith("s: half"), seen
    done = until_done(m, task["taskId"])
    assert done["status"] == "completed" and done["resultType"] == "complete"
    out = done["result"]["structuredContent"]
    assert (out["status"], out["exit_code"], out["stdout"]) == ("exited", 0, "half\nwhole\n")
    assert "io.modelcontextprotocol/related-task" not in done["result"].get("_meta", {})
    assert acked(m.ok("tasks/update", {"taskId": task["taskId"], "inputResponses": {}}))
    # a terminal task: an ack, and nothing changes
    assert acked(m.ok("tasks/cancel", {"taskId": task["taskId"]}))
    assert until_done(m, task["taskId"])["status"] == "completed"

    other = RawMcp(real.url, real.new_token("bob", "bob's"))
    for unknown in (task["taskId"], "no-such-task"):
        for method in ("tasks/get", "tasks/cancel", "tasks/update"):
            error = other.request(method, {"taskId": unknown}).error
            assert error == {"code": -32602, "message": "unknown task"}, (method, error)
    bare = RawMcp(real.url, real.token, declare_tasks=False)
    assert bare.err("tasks/get", {"taskId": task["taskId"]})["code"] == -32021
    plain = bare.call("rift_vm_exec", {"handle": handle, "vm_id": vm_id, "command": "sleep 2"})
    assert plain.result is not None and plain.result.get("resultType") == "complete"
    for removed in ("tasks/result", "tasks/list"):
        assert m.err(removed, {"taskId": task["taskId"]})["code"] == -32601


def _news(m: RawMcp, task_id: str, line: str) -> dict[str, Any] | None:
    got = m.request("tasks/get", {"taskId": task_id}).result
    assert got is not None
    return got if got["statusMessage"].endswith(line) else None


def test_a_task_cancel_kills_the_exec_but_not_under_a_lease_that_moved_on(
        real: Server, vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    m = RawMcp(real.url, real.token)
    task = m.call("rift_vm_exec", {"handle": handle, "vm_id": vm_id,
                                   "command": "sleep 300"}).result
    assert task is not None and task["resultType"] == "task"
    exec_id = _exec_of(m, handle, "sleep 300")
    assert acked(m.ok("tasks/cancel", {"taskId": task["taskId"]}))
    assert m.ok("tasks/get", {"taskId": task["taskId"]})["status"] == "cancelled"
    wait_until(lambda: exec_status(m, handle, exec_id) == "killed" or None, 15, "the kill")

    # Under a lease another holder took: refused, and the command runs on.
    own = tool(m, "rift_task_new", {"name": "moved"})
    own_vm = tool(m, "rift_vm_new", {"handle": own["handle"], "image": "tiny"},
                  timeout_s=180)["vm"]["id"]
    task = m.call("rift_vm_exec", {"handle": own["handle"], "vm_id": own_vm,
                                   "command": "sleep 301"}).result
    assert task is not None and task["resultType"] == "task"
    exec_id = _exec_of(m, own["handle"], "sleep 301")
    taken = tool(m, "rift_task_attach", {"task_id": own["task"]["id"], "takeover": True})
    refusal = m.request("tasks/cancel", {"taskId": task["taskId"]}).error
    assert refusal is not None and refusal["data"]["error"]["code"] == "lease_stale", refusal
    assert m.ok("tasks/get", {"taskId": task["taskId"]})["status"] == "working"
    assert exec_status(m, taken["handle"], exec_id) == "running"
    tool(m, "rift_task_close", {"handle": taken["handle"]})
    ended = until_done(m, task["taskId"])
    assert ended["result"]["structuredContent"].get("status") == "lost", ended


def _exec_of(m: RawMcp, handle: str, command: str) -> str:
    def find() -> str | None:
        execs = tool(m, "rift_vm_exec_list", {"handle": handle})["execs"]
        return next((e["exec_id"] for e in execs if e["command"] == command), None)
    return wait_until(find, 10, f"the exec of {command!r}")


def test_listen_sends_the_callers_tasks_as_they_change(real: Server,
                                                       vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    m = RawMcp(real.url, real.token)
    task = m.call("rift_vm_exec", {"handle": handle, "vm_id": vm_id,
                                   "command": "sleep 4; echo listened"}).result
    assert task is not None and task["resultType"] == "task"
    frames = []
    for frame in m.stream("subscriptions/listen", {"notifications": {
            "taskIds": [task["taskId"], "someone-elses"]}}, timeout_s=60):
        frames.append(frame)
        if frame.get("method") == "notifications/tasks" and \
                frame["params"]["status"] != "working":
            break
    ack, *changes = frames
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["notifications"] == {"taskIds": [task["taskId"]]}
    last = changes[-1]["params"]
    assert last["taskId"] == task["taskId"] and last["status"] == "completed", changes
    assert last["result"]["structuredContent"]["stdout"] == "listened\n"
    listen_id = ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
    assert changes[-1]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == listen_id
    bare = RawMcp(real.url, real.token, declare_tasks=False)
    refusal = bare.request("subscriptions/listen", {"notifications": {"taskIds": ["x"]}})
    assert refusal.error is not None and refusal.error["code"] == -32021, refusal


def test_2025_tasks_create_get_result_list_and_cancel(real: Server,
                                                      vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    m = RawMcp(real.url, real.token, era=LEGACY)
    init = m.initialize()
    assert init["capabilities"]["tasks"] == {
        "list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    tools = {t["name"]: t for t in m.ok("tools/list", {})["tools"]}
    assert tools["rift_vm_exec"]["execution"] == {"taskSupport": "optional"}
    assert "execution" not in tools["rift_task_new"]

    made = m.call("rift_vm_exec", {"handle": handle, "vm_id": vm_id,
                                   "command": "sleep 3; echo legacy"}, task={"ttl": 120000})
    assert made.result is not None, made
    task = made.result["task"]
    assert (task["status"], task["ttl"]) == ("working", 120000) and "taskId" in task
    got = m.request("tasks/get", {"taskId": task["taskId"]}).result
    assert got is not None and got["status"] == "working" and "ttlMs" not in got
    result = m.request("tasks/result", {"taskId": task["taskId"]}).result  # waits for the end
    assert result is not None and result["structuredContent"]["stdout"] == "legacy\n"
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    listed = m.request("tasks/list", {}).result
    assert listed is not None and task["taskId"] in [t["taskId"] for t in listed["tasks"]]

    long = m.call("rift_vm_exec", {"handle": handle, "vm_id": vm_id, "command": "sleep 302"},
                  task={"ttl": 120000}).result
    assert long is not None
    exec_id = _exec_of(m, handle, "sleep 302")
    cancelled = m.request("tasks/cancel", {"taskId": long["task"]["taskId"]}).result
    assert cancelled is not None and cancelled["status"] == "cancelled", cancelled
    again = m.request("tasks/cancel", {"taskId": long["task"]["taskId"]}).error
    assert again is not None and again["code"] == -32602  # a terminal task, as 2025-11-25 has it
    wait_until(lambda: exec_status(m, handle, exec_id) == "killed" or None, 15, "the kill")
    refused_call = m.call("rift_vm_exec", {"handle": "task_aaaaaaaa.bad", "vm_id": vm_id,
                                           "command": "true"}, task={"ttl": 60000}).result
    assert refused_call is not None
    failed = m.request("tasks/get", {"taskId": refused_call["task"]["taskId"]}).result
    assert failed is not None and failed["status"] == "failed", failed
    assert m.call("rift_task_list", {}, task={"ttl": 60000}).error == {
        "code": -32601, "message": "rift_task_list does not run as a task (taskSupport forbidden)"}


def test_closing_the_stream_of_a_2026_plain_call_kills_its_command(
        real: Server, vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    m = RawMcp(real.url, real.token, declare_tasks=False)
    _drop_after(m, 3, "tools/call", {"name": "rift_vm_exec", "arguments": {
        "handle": handle, "vm_id": vm_id, "command": "sleep 303", "wait_s": 60}})
    exec_id = _exec_of(m, handle, "sleep 303")
    wait_until(lambda: exec_status(m, handle, exec_id) == "killed" or None, 20, "the kill")


def test_notifications_cancelled_kills_but_a_bare_disconnect_does_not_in_2025(
        real: Server, vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    m = RawMcp(real.url, real.token, era=LEGACY)
    m.initialize()
    args = {"handle": handle, "vm_id": vm_id, "wait_s": 60}
    calling = threading.Thread(target=lambda: m.request("tools/call", {
        "name": "rift_vm_exec", "arguments": {**args, "command": "sleep 304"}},
        timeout_s=90, request_id=4040), daemon=True)
    calling.start()
    exec_id = _exec_of(m, handle, "sleep 304")
    assert m.notify("notifications/cancelled", {"requestId": 4040, "reason": "test"}) == 202
    wait_until(lambda: exec_status(m, handle, exec_id) == "killed" or None, 20, "the kill")
    calling.join(30)

    _drop_after(m, 3, "tools/call", {"name": "rift_vm_exec", "arguments": {
        **args, "command": "sleep 305"}})
    exec_id = _exec_of(m, handle, "sleep 305")
    time.sleep(6.5)  # past a step of the wait: nothing was cancelled
    assert exec_status(m, handle, exec_id) == "running"
    tool(m, "rift_vm_exec_kill", {"handle": handle, "exec_id": exec_id, "signal": "KILL"})


def _drop_after(m: RawMcp, seconds: float, method: str, params: dict[str, Any]) -> None:
    """Send a request and close its connection after `seconds`, unanswered."""
    try:
        with httpx.stream("POST", m.url + "/mcp", headers=m.headers(method, params),
                          json=m.body(method, params), timeout=seconds) as response:
            for _ in response.iter_bytes():
                pass
    except httpx.ReadTimeout:
        return
    pytest.fail("the call answered before its connection was closed")


def test_rift_vm_new_as_a_task_answers_the_vm_and_its_cancel_destroys_it(
        real: Server) -> None:
    m = RawMcp(real.url, real.token)
    opened = tool(m, "rift_task_new", {"name": "boots"})
    try:
        made = m.call("rift_vm_new", {"handle": opened["handle"], "image": "tiny"}).result
        assert made is not None and made["resultType"] == "task", made  # a boot takes > 1 s
        done = until_done(m, made["taskId"], 180)
        vm_view = done["result"]["structuredContent"]["vm"]
        assert vm_view["status"] == "running" and done["statusMessage"].endswith(
            f"{vm_view['id']}: running")
        again = m.call("rift_vm_new", {"handle": opened["handle"], "image": "tiny"}).result
        assert again is not None and again["resultType"] == "task"
        assert acked(m.ok("tasks/cancel", {"taskId": again["taskId"]}))

        def gone() -> bool | None:
            vms = tool(m, "rift_task_get", {"handle": opened["handle"]})["task"]["vms"]
            others = [v for v in vms if v["id"] != vm_view["id"]]
            return True if others and all(v["status"] == "destroyed" for v in others) else None
        wait_until(gone, 180, "the cancelled VM to be destroyed")
        heard = run(lambda: _boot_progress(real, opened["handle"]))
        assert heard and all(message and message.endswith(": booting") for message in heard), \
            heard
    finally:
        tool(m, "rift_task_close", {"handle": opened["handle"]})


async def _boot_progress(real: Server, handle: str) -> list[str | None]:
    """The progress messages of a plain `rift_vm_new` (a `tiny` boots in 5-7 s here)."""
    heard: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(message)

    async with mcp_session(real.url, real.token) as s:
        result = await s.call_tool("rift_vm_new", {"handle": handle, "image": "tiny",
                                                   "memory_mib": 128},
                                   progress_callback=on_progress)
    assert not result.is_error, result
    return heard


@long_form("tests/unit/test_execs.py::test_a_call_waiting_on_its_guest_keeps_the_lease_active")
def test_a_call_in_flight_keeps_its_lease_active_past_the_quiet_time(
        real: Server, vm: tuple[str, str]) -> None:
    """An exec waited on for 2.5 quiet times: another client's attach without
    takeover is `task_held` all along (RIFT_LEASE_QUIET_S=6 here)."""
    handle, vm_id = vm
    m = RawMcp(real.url, real.token, declare_tasks=False)
    task_id = tool(m, "rift_task_get", {"handle": handle})["task"]["id"]
    waiting = threading.Thread(target=lambda: tool(m, "rift_vm_exec", {
        "handle": handle, "vm_id": vm_id, "command": f"sleep {QUIET_S * 5 // 2}",
        "wait_s": QUIET_S * 3}), daemon=True)
    waiting.start()

    async def attach_refused() -> None:
        async with mcp_session(real.url, real.token, name="other-agent") as s:
            await refused(s, "task_held", "rift_task_attach", task_id=task_id)

    for _ in range(5):
        time.sleep(QUIET_S / 2)
        run(attach_refused)
    waiting.join(QUIET_S * 3)
    assert not waiting.is_alive()


def test_the_sse_stream_sends_the_output_as_it_comes_then_the_end(
        real: Server, vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    m = RawMcp(real.url, real.token, declare_tasks=False)
    started = tool(m, "rift_vm_exec", {"handle": handle, "vm_id": vm_id, "wait_s": 0,
                                       "command": "for i in 1 2 3; do echo n$i; sleep 1; done"})
    events: list[tuple[str, dict[str, Any], float]] = []
    url = f"{real.url}/api/v1/execs/{started['exec_id']}/stream"
    with httpx.stream("GET", url, timeout=60, headers={
            "Authorization": f"Bearer {real.token}", "Rift-Handle": handle}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name:
                events.append((name, json.loads(line[6:]), time.monotonic()))
    outputs = [data for name, data, _ in events if name == "stdout"]
    assert "".join(d["text"] for d in outputs) == "n1\nn2\nn3\n"
    assert len(outputs) >= 2 and events[-1][0] == "end", events  # as it came, not at once
    assert events[-1][1]["status"] == "exited" and "stdout" not in events[-1][1]
    missing = httpx.get(f"{real.url}/api/v1/execs/exec_aaaaaaaa/stream", timeout=30, headers={
        "Authorization": f"Bearer {real.token}", "Rift-Handle": handle})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "exec_not_found"



def _rss_mib(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_a_command_that_prints_a_gib_keeps_guest_and_rift_within_their_memory(
        real: Server, rig: Rig, vm: tuple[str, str]) -> None:
    """The guest keeps the newest RIFT_EXEC_OUTPUT_MIB (16) of each stream; a
    `tiny` guest has 256 MiB, so a ring that did not hold would kill it."""
    handle, vm_id = vm
    m = RawMcp(real.url, real.token, declare_tasks=False)
    pid = rig.pid
    rift_before = _rss_mib(pid)
    free = "grep MemAvailable /proc/meminfo | tr -s ' ' | cut -d' ' -f2"
    guest_before = int(tool(m, "rift_vm_exec", {"handle": handle, "vm_id": vm_id,
                                                "command": free})["stdout"])
    out = tool(m, "rift_vm_exec", {"handle": handle, "vm_id": vm_id, "wait_s": 300,
                                   "timeout_s": 600,
                                   "command": "dd if=/dev/zero bs=1048576 count=1024; "
                                              "echo done >&2"},
               timeout_s=400)
    assert (out["status"], out["exit_code"]) == ("exited", 0), out
    assert out["stderr"].endswith("done\n") and "1024+0 records out" in out["stderr"]
    assert out["stdout_bytes"] == 1 << 30 and out["truncated"], out["stdout_bytes"]
    assert len(out["stdout"]) == 1 << 20 and out["stdout_offset"] == (1 << 30) - (16 << 20) + (
        1 << 20)
    tail = tool(m, "rift_vm_exec_get", {"handle": handle, "exec_id": out["exec_id"],
                                        "stdout_offset": (1 << 30) - 10})
    assert tail["stdout"] == "\0" * 10 and not tail["truncated"]
    guest_after = int(tool(m, "rift_vm_exec", {"handle": handle, "vm_id": vm_id,
                                               "command": free})["stdout"])
    assert guest_before - guest_after < 64 * 1024, (guest_before, guest_after)  # KiB
    assert _rss_mib(pid) - rift_before < 100, (rift_before, _rss_mib(pid))


def test_the_inspector_cli_waits_for_an_exec_in_both_eras(real: Server,
                                                           vm: tuple[str, str]) -> None:
    handle, vm_id = vm
    for era in ("modern", "legacy"):
        out = call_tool(real.url, real.token, era, "rift_vm_exec", handle=handle, vm_id=vm_id,
                        command=f"sleep 3; echo {era}")
        assert not out.get("isError"), out
        assert (out["structuredContent"]["status"], out["structuredContent"]["stdout"]) == \
            ("exited", f"{era}\n"), out
