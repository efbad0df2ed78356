"""Refusals through MCP: every SPEC §4 code reachable on libvirt's test driver
(quotas and budgets: test_mcp_limits), auth, protocol faults and metrics."""

from __future__ import annotations

import json
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.support.mcp_clients import (
    MODERN,
    REFUSAL_CODES,
    WAIT_S,
    call,
    innermost,
    mcp_session,
    refused,
    run,
)
from tests.support.servers import Server


def test_every_refusal_reachable_on_the_test_driver(server: Server) -> None:
    seen: set[str] = set()

    async def scenario() -> None:
        async with mcp_session(server.url, server.token, "refusals") as s:
            async def no(code: str, tool: str, **args: Any) -> dict[str, Any]:
                seen.add(code)
                return await refused(s, code, tool, **args)

            opened = await call(s, "rift_task_new", name="refusals", idempotency_key="r-1")
            task_id, handle = opened["task"]["id"], opened["handle"]
            await no("handle_required", "rift_task_release")
            await no("handle_required", "rift_vm_new")
            await no("handle_invalid", "rift_task_release", handle="nope")
            await no("handle_invalid", "rift_vm_exec", handle="task_x.y", vm_id="vm_aaaaaaaa",
                     command="true")
            await no("task_not_found", "rift_task_get", task_id="task_aaaaaaaa")
            await no("task_not_found", "rift_task_events", task_id="task_aaaaaaaa")
            await no("task_held", "rift_task_attach", task_id=task_id)
            await no("task_held", "rift_task_close", task_id=task_id)
            await no("vm_not_found", "rift_vm_get", vm_id="vm_aaaaaaaa")
            await no("image_not_found", "rift_vm_new", handle=handle, image="nope")
            await no("idempotency_conflict", "rift_task_new", name="other",
                     idempotency_key="r-1")
            for tool, args, field in (
                    ("rift_task_new", {"name": ""}, "name"),
                    ("rift_task_new", {"name": "x" * 201}, "name"),
                    ("rift_task_new", {"colour": "red"}, "colour"),
                    ("rift_task_list", {"limit": 0}, "limit"),
                    ("rift_task_list", {"status": "gone"}, "status"),
                    ("rift_task_attach", {}, "task_id"),
                    ("rift_task_attach", {"task_id": task_id, "takeover": "yes"}, "takeover"),
                    ("rift_vm_new", {"handle": handle, "vcpus": 65}, "vcpus"),
                    ("rift_vm_new", {"handle": handle, "memory_mib": 63}, "memory_mib"),
                    ("rift_vm_new", {"handle": handle, "memory_mib": "big"}, "memory_mib"),
                    ("rift_vm_new", {"handle": handle, "disk_gib": 0}, "disk_gib"),
                    ("rift_vm_new", {"handle": handle, "disk_gib": 1025}, "disk_gib"),
                    ("rift_vm_exec", {"handle": handle, "vm_id": "vm_aaaaaaaa",
                                      "command": "x" * (64 * 1024 + 1)}, "command"),
                    ("rift_vm_exec", {"handle": handle, "vm_id": "vm_aaaaaaaa",
                                      "command": "true", "timeout_s": 86401}, "timeout_s"),
                    ("rift_vm_read_file", {"handle": handle, "vm_id": "vm_aaaaaaaa",
                                           "path": "/x", "encoding": "latin-1"}, "encoding"),
                    ("rift_task_get", {}, "task_id")):
                error = await no("invalid_argument", tool, **args)
                assert error["field"] == field, (tool, args, error)

            vm = (await call(s, "rift_vm_new", handle=handle))["vm"]
            await no("volume_not_found", "rift_volume_get", volume_id="vol_aaaaaaaa")
            vol = (await call(s, "rift_volume_new", name="refusals", size_gib=1))["volume"]
            error = await no("invalid_argument", "rift_vm_attach_volume", handle=handle,
                             vm_id=vm["id"], volume_id=vol["id"], path="/etc/data")
            assert error["field"] == "path", error
            await call(s, "rift_vm_attach_volume", handle=handle, vm_id=vm["id"],
                       volume_id=vol["id"], path="/data")
            await no("volume_busy", "rift_volume_delete", volume_id=vol["id"])
            await no("guest_unreachable", "rift_vm_exec", handle=handle, vm_id=vm["id"],
                     command="true")
            await no("exec_not_found", "rift_vm_exec_get", handle=handle,
                     exec_id="exec_aaaaaaaa")
            await no("snapshot_not_found", "rift_vm_snapshot_delete", handle=handle,
                     snapshot_id="snap_aaaaaaaa")
            await no("snapshot_not_found", "rift_vm_fork", handle=handle,
                     snapshot_id="snap_aaaaaaaa")
            await call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
            await call(s, "rift_volume_delete", volume_id=vol["id"])  # detached with its VM
            error = await no("vm_not_running", "rift_vm_exec", handle=handle, vm_id=vm["id"],
                             command="true")
            assert error["vm_status"] == "destroyed"

            # Two VMs of 64 vCPUs cannot both fit a 64-vCPU host.
            big: list[str] = []
            for _ in range(8):  # the test host offers 64 CPUs x RIFT_CPU_OVERCOMMIT
                result = await s.call_tool("rift_vm_new", {"handle": handle, "vcpus": 64})
                if result.is_error:
                    assert (result.structured_content or {})["error"]["code"] == "no_capacity"
                    seen.add("no_capacity")
                    break
                big.append((result.structured_content or {})["vm"]["id"])
            for vm_id in big:
                await call(s, "rift_vm_destroy", handle=handle, vm_id=vm_id)

            await call(s, "rift_task_release", handle=handle)
            await no("task_released", "rift_task_release", handle=handle)
            await no("task_released", "rift_vm_new", handle=handle)
            fresh = await call(s, "rift_task_attach", task_id=task_id)
            await no("lease_stale", "rift_task_get", handle=handle)
            await call(s, "rift_task_close", handle=fresh["handle"])
            closed = await no("task_closed", "rift_task_close", handle=fresh["handle"])
            assert closed["close_reason"] == "closed"
            await no("task_closed", "rift_task_attach", task_id=task_id)
            await no("task_closed", "rift_task_new", name="refusals", idempotency_key="r-1")

    run(scenario)
    # quota_exceeded and rate_limited: test_mcp_limits; unauthorized: below.
    # hypervisor_error needs libvirt itself to refuse, which the test driver does not;
    # context_not_found a guest's code server (tests/integration/test_code_doors.py);
    # build_failed no MCP tool makes (REST and the CLI build: test_builds_doors.py).
    assert seen == REFUSAL_CODES - {"quota_exceeded", "rate_limited", "unauthorized",
                                    "hypervisor_error", "context_not_found", "build_failed"}


def test_another_users_task_is_not_found(server: Server) -> None:
    other_token = server.new_token("bob", "bob's laptop")

    async def scenario() -> None:
        async with (mcp_session(server.url, server.token, "alice-agent") as mine,
                    mcp_session(server.url, other_token, "bob-agent") as theirs):
            opened = await call(mine, "rift_task_new", name="mine")
            task_id = opened["task"]["id"]
            vm = (await call(mine, "rift_vm_new", handle=opened["handle"]))["vm"]
            for tool, args in (("rift_task_get", {"task_id": task_id}),
                               ("rift_task_attach", {"task_id": task_id, "takeover": True}),
                               ("rift_task_events", {"task_id": task_id}),
                               ("rift_task_close", {"task_id": task_id, "takeover": True}),
                               ("rift_task_get", {"handle": opened["handle"]})):
                await refused(theirs, "task_not_found", tool, **args)
            await refused(theirs, "vm_not_found", "rift_vm_get", vm_id=vm["id"])
            await refused(theirs, "vm_not_found", "rift_vm_destroy", vm_id=vm["id"],
                          takeover=True)
            assert task_id not in [t["id"] for t in
                                   (await call(theirs, "rift_task_list", status="all"))["tasks"]]
            still = await call(mine, "rift_task_get", handle=opened["handle"])
            assert still["task"]["holder"] == "mcp:alice-agent"
            assert still["task"]["vms"][0]["status"] == "running"
            await call(mine, "rift_task_close", handle=opened["handle"])

    run(scenario)


# -- auth and protocol faults ---------------------------------------------------------

def test_a_missing_wrong_or_revoked_token_gets_the_sdks_401(server: Server) -> None:
    token = server.new_token("carol", "soon revoked")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "rift_task_new", "arguments": {"name": "never"}}}
    accept = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MODERN}
    listed = server.rift("token", "list", "carol", "--json")
    token_id = json.loads(listed.stdout)[0]["id"]
    assert server.rift("token", "revoke", token_id).returncode == 0
    calls_before = mcp_tool_calls(server)
    for bearer in (None, "rift_" + "A" * 43, token):
        headers = dict(accept, **({"Authorization": f"Bearer {bearer}"} if bearer else {}))
        answer = httpx.post(server.url + "/mcp", json=body, headers=headers, timeout=WAIT_S)
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"].startswith("Bearer")

    async def scenario() -> None:
        for era in (MODERN, "2025-11-25"):
            statuses: list[int] = []
            with pytest.raises(BaseException) as info:
                async with mcp_session(server.url, token, "locked out", era, statuses) as s:
                    await s.call_tool("rift_task_new", {"name": "never"})
            assert statuses == [401], statuses
            assert isinstance(innermost(info.value), MCPError), info.value

    run(scenario)
    assert mcp_tool_calls(server) == calls_before  # no tool ran: nothing was touched


def mcp_tool_calls(server: Server) -> float:
    """Every MCP tool call the server has counted, whatever its tool and outcome."""
    text = httpx.get(server.url + "/metrics", timeout=WAIT_S,
                     headers={"Authorization": f"Bearer {server.token}"}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("rift_tool_calls_total{") and 'door="mcp"' in line)


def test_an_unknown_tool_and_a_malformed_request_are_json_rpc_errors(server: Server) -> None:
    async def scenario() -> None:
        for era in (MODERN, "2025-11-25"):
            async with mcp_session(server.url, server.token, era=era) as session:
                with pytest.raises(MCPError) as info:
                    await session.call_tool("rift_teleport", {})
                assert info.value.code == types.INVALID_PARAMS

    run(scenario)
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    for era in (MODERN, "2025-11-25"):
        answer = httpx.post(server.url + "/mcp", content=b"{not json",
                            headers=dict(headers, **{"MCP-Protocol-Version": era}),
                            timeout=WAIT_S)
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == types.PARSE_ERROR


def test_mcp_is_served_at_exactly_slash_mcp_without_redirects(server: Server) -> None:
    answer = httpx.post(server.url + "/mcp", json={}, timeout=WAIT_S)
    assert answer.status_code == 401  # the door itself, not a redirect to /mcp/
    got = httpx.get(server.url + "/mcp", timeout=WAIT_S,
                    headers={"Authorization": f"Bearer {server.token}"})
    assert got.status_code == 405


def test_tool_calls_are_counted_by_tool_and_outcome(server: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(server.url, server.token) as session:
            await call(session, "rift_task_list")
            await refused(session, "vm_not_found", "rift_vm_get", vm_id="vm_aaaaaaaa")

    run(scenario)
    text = httpx.get(server.url + "/metrics", timeout=WAIT_S,
                     headers={"Authorization": f"Bearer {server.token}"}).text
    lines = [line for line in text.splitlines() if line.startswith("rift_tool_calls_total{")]
    assert any('door="mcp"' in line and 'tool="rift_task_list"' in line
               and 'outcome="ok"' in line for line in lines), lines
    assert any('door="mcp"' in line and 'tool="rift_vm_get"' in line
               and 'outcome="vm_not_found"' in line for line in lines), lines
