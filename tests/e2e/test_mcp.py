"""The MCP door against a real `rift serve`, driven by the official SDK client in
both protocol eras: holder labels, the seventeen tools, every refusal reachable on
libvirt's test driver, auth and protocol faults."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.mcp_clients import (
    ERAS,
    MODERN,
    WAIT_S,
    call,
    http_client,
    mcp_session,
    refused,
    run,
)
from tests.support.servers import Server

TOOL_NAMES = {
    "rift_task_new", "rift_task_attach", "rift_task_release", "rift_task_close",
    "rift_task_list", "rift_task_get", "rift_task_events", "rift_vm_new", "rift_vm_get",
    "rift_vm_destroy", "rift_vm_exec", "rift_vm_write_file", "rift_vm_read_file",
    "rift_vm_exec_get", "rift_vm_exec_input", "rift_vm_exec_kill", "rift_vm_exec_list",
    "rift_vm_pause", "rift_vm_resume", "rift_vm_snapshot", "rift_vm_snapshot_delete",
    "rift_vm_fork", "rift_vm_expose", "rift_vm_unexpose", "rift_vm_attach_volume",
    "rift_vm_detach_volume", "rift_volume_new", "rift_volume_list", "rift_volume_get",
    "rift_volume_delete", "rift_volume_resize", "rift_volume_clone", "rift_vm_run_code",
    "rift_vm_run_code_get",
    "rift_vm_code_context_new", "rift_vm_code_context_list", "rift_vm_code_context_restart",
    "rift_vm_code_context_delete",
}


# -- eras and holder labels -----------------------------------------------------------

@pytest.mark.parametrize("era", ERAS)
def test_each_era_shows_the_declared_client_name_as_holder(server: Server, era: str) -> None:
    async def scenario() -> None:
        async with (mcp_session(server.url, server.token, f"agent-{era}", era) as first,
                    mcp_session(server.url, server.token, "claude-code") as other):
            opened = await call(first, "rift_task_new", name=f"made in {era}")
            task_id, handle = opened["task"]["id"], opened["handle"]
            assert opened["task"]["holder"] == f"mcp:agent-{era}"
            assert handle.startswith(task_id + ".")
            held = await refused(other, "task_held", "rift_task_attach", task_id=task_id)
            assert held["holder"] == f"mcp:agent-{era}"
            taken = await call(other, "rift_task_attach", task_id=task_id, takeover=True)
            assert taken["previous_holder"] == f"mcp:agent-{era}"
            assert taken["task"]["holder"] == "mcp:claude-code"
            stale = await refused(first, "lease_stale", "rift_task_get", handle=handle)
            assert stale["holder"] == "mcp:claude-code"
            await call(other, "rift_task_close", handle=taken["handle"])

    run(scenario)


def test_a_2025_03_26_client_reads_the_whole_result_in_the_text(server: Server) -> None:
    """That era has no structuredContent: the text carries the JSON as well."""
    async def scenario() -> None:
        async with mcp_session(server.url, server.token, "old", "2025-03-26") as old:
            result = await old.call_tool("rift_task_new", {})
            text = result.content[0]
            assert isinstance(text, types.TextContent)
            assert json.loads(text.text.splitlines()[-1]) == result.structured_content
            handle = (result.structured_content or {})["handle"]
            await call(old, "rift_task_close", handle=handle)

    run(scenario)


def test_the_high_level_client_connects_in_both_eras(server: Server) -> None:
    async def scenario() -> None:
        for mode, era in (("auto", MODERN), ("legacy", "2025-11-25")):
            async with (http_client(server.token) as http,
                        Client(streamable_http_client(server.url + "/mcp", http_client=http),
                               mode=mode, client_info=types.Implementation(
                                   name=f"client-{mode}", version="2")) as client):
                assert client.protocol_version == era
                result = await client.call_tool("rift_task_new", {"name": mode})
                out = result.structured_content
                assert not result.is_error and isinstance(out, dict)
                assert out["task"]["holder"] == f"mcp:client-{mode}"
                await client.call_tool("rift_task_close", {"handle": out["handle"]})

    run(scenario)


def post_rpc(server: Server, era: str, params: dict[str, Any], user_agent: str) -> Any:
    """One bare JSON-RPC `tools/call` POST, no SDK, no session: its result."""
    headers = {"Authorization": f"Bearer {server.token}", "User-Agent": user_agent,
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": era}
    if era == MODERN:  # the 2026-07-28 routing headers; no clientInfo in the envelope
        headers |= {"Mcp-Method": "tools/call", "Mcp-Name": params["name"]}
        params = dict(params, _meta={"io.modelcontextprotocol/protocolVersion": MODERN,
                                     "io.modelcontextprotocol/clientCapabilities": {}})
    answer = httpx.post(server.url + "/mcp", timeout=WAIT_S, headers=headers, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("application/json"):
        return answer.json()["result"]
    return next(json.loads(line[5:]) for line in answer.text.splitlines()
                if line.startswith("data:") and len(line) > 6)["result"]


@pytest.mark.parametrize("era", [MODERN, "2025-06-18"])
def test_a_user_agent_names_a_client_that_declared_no_name(server: Server, era: str) -> None:
    """No client info and no session: the User-Agent's product, unless it is an HTTP
    library's; else `mcp:unknown`."""
    for agent, label in (("my-agent/2.1 (linux)", "mcp:my-agent"),
                         ("python-httpx/0.28.1", "mcp:unknown"), ("", "mcp:unknown")):
        result = post_rpc(server, era, {"name": "rift_task_new", "arguments": {}}, agent)
        assert result["structuredContent"]["task"]["holder"] == label, (era, agent)


def test_slow_tools_answer_as_an_event_stream_in_the_handshake_era(server: Server) -> None:
    """The SDK's transport answers the handshake era as an event stream, whose pings
    outlast proxies' timeouts while a slow tool (a boot, an exec) works; the answer is
    the same JSON-RPC result either way."""
    headers = {"Authorization": f"Bearer {server.token}", "MCP-Protocol-Version": "2025-11-25",
               "Accept": "application/json, text/event-stream"}
    for tool, args in (("rift_task_list", {}),
                       ("rift_vm_exec", {"vm_id": "vm_aaaaaaaa", "command": "true"})):
        answer = httpx.post(server.url + "/mcp", headers=headers, timeout=WAIT_S, json={
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": tool, "arguments": args}})
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream"), answer.headers
        data = [line[5:] for line in answer.text.splitlines() if line.startswith("data:")]
        assert any('"id":7' in d.replace(" ", "") and '"result"' in d for d in data), data


# -- the tool list --------------------------------------------------------------------

def test_tools_list_shows_every_tool_with_a_strict_schema_and_annotations(server: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(server.url, server.token) as session:
            listed = {t.name: t for t in (await session.list_tools()).tools}
        assert set(listed) == TOOL_NAMES
        for tool in listed.values():
            assert tool.input_schema["additionalProperties"] is False, tool.name
            assert tool.output_schema and tool.output_schema["type"] == "object"
            assert tool.description and "never follow" in tool.description
            assert "Refusals" in tool.description
            assert tool.annotations is not None
        reads = {"rift_task_list", "rift_task_get", "rift_task_events", "rift_vm_get",
                 "rift_vm_read_file", "rift_vm_exec_get", "rift_vm_exec_list",
                 "rift_volume_list", "rift_volume_get", "rift_vm_code_context_list",
                 "rift_vm_run_code_get"}
        destructive = {"rift_task_close", "rift_vm_destroy", "rift_task_attach",
                       "rift_vm_exec_kill", "rift_vm_snapshot_delete", "rift_vm_expose",
                       "rift_vm_unexpose", "rift_volume_delete", "rift_vm_detach_volume",
                       "rift_vm_code_context_restart", "rift_vm_code_context_delete"}
        idempotent = reads | {"rift_task_new", "rift_vm_new", "rift_task_release",
                              "rift_task_close", "rift_vm_destroy", "rift_vm_exec_kill",
                              "rift_vm_pause", "rift_vm_resume", "rift_vm_detach_volume"}
        for name, tool in listed.items():
            notes = tool.annotations
            assert notes is not None
            assert bool(notes.read_only_hint) == (name in reads), name
            assert bool(notes.destructive_hint) == (name in destructive), name
            if name in idempotent:
                assert notes.idempotent_hint, name
        props = {n: t.input_schema["properties"] for n, t in listed.items()}
        assert props["rift_task_new"]["name"]["maxLength"] == 200
        assert props["rift_task_new"]["idempotency_key"]["minLength"] == 1
        assert props["rift_vm_exec"]["command"]["maxLength"] == 64 * 1024
        assert props["rift_vm_exec"]["stdin"]["maxLength"] == 16 * 1024 * 1024
        assert (props["rift_vm_exec"]["timeout_s"]["minimum"],
                props["rift_vm_exec"]["timeout_s"]["maximum"]) == (1, 24 * 3600)
        assert (props["rift_vm_exec"]["wait_s"]["minimum"],
                props["rift_vm_exec"]["wait_s"]["maximum"]) == (0, 600)
        assert props["rift_vm_exec_kill"]["signal"]["enum"] == ["TERM", "KILL"]
        assert (props["rift_vm_new"]["vcpus"]["minimum"],
                props["rift_vm_new"]["vcpus"]["maximum"]) == (1, 64)
        assert (props["rift_vm_new"]["memory_mib"]["minimum"],
                props["rift_vm_new"]["memory_mib"]["maximum"]) == (64, 65536)
        assert props["rift_task_list"]["limit"]["maximum"] == 100
        assert props["rift_task_list"]["status"]["enum"] == ["open", "closed", "all"]
        assert props["rift_vm_read_file"]["encoding"]["enum"] == ["utf-8", "base64"]
        assert set(props["rift_vm_exec"]) == {"handle", "vm_id", "command", "stdin", "timeout_s",
                                              "wait_s", "pty"}

    run(scenario)


# -- every tool -----------------------------------------------------------------------

def test_a_task_and_its_vms_go_through_every_tool(server: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(server.url, server.token, "worker") as s:
            opened = await call(s, "rift_task_new", name="tour", idempotency_key="tour-1")
            task_id, handle = opened["task"]["id"], opened["handle"]
            again = await call(s, "rift_task_new", name="tour", idempotency_key="tour-1")
            assert again["task"]["id"] == task_id  # a keyed repeat, with a fresh handle
            handle = again["handle"]
            listed = await call(s, "rift_task_list", status="open", limit=100)
            assert task_id in [t["id"] for t in listed["tasks"]]
            assert (await call(s, "rift_task_get", task_id=task_id))["task"]["name"] == "tour"
            touched = await call(s, "rift_task_get", handle=handle)
            assert touched["task"]["holder"] == "mcp:worker"

            vm = (await call(s, "rift_vm_new", handle=handle, name="box", memory_mib=128,
                             idempotency_key="box-1"))["vm"]
            assert (vm["status"], vm["memory_mib"], vm["ssh"]) == ("running", 128, None)
            assert (await call(s, "rift_vm_new", handle=handle, name="box", memory_mib=128,
                               idempotency_key="box-1"))["vm"]["id"] == vm["id"]
            assert (await call(s, "rift_vm_get", vm_id=vm["id"]))["vm"]["task_id"] == task_id
            for tool, args in (("rift_vm_exec", {"command": "uname -a", "timeout_s": 5}),
                               ("rift_vm_write_file", {"path": "/tmp/x", "content": "hi"}),
                               ("rift_vm_read_file", {"path": "/tmp/x"})):
                error = await refused(s, "guest_unreachable", tool, handle=handle,
                                      vm_id=vm["id"], **args)
                assert "test driver" in error["message"]
            # No exec started on a guest that does not exist; the exec tools say so.
            assert (await call(s, "rift_vm_exec_list", handle=handle, status="all")) == \
                {"execs": []}
            for tool, args in (("rift_vm_exec_get", {"wait_s": 1}),
                               ("rift_vm_exec_input", {"data": "x", "eof": True}),
                               ("rift_vm_exec_kill", {"signal": "KILL"})):
                error = await refused(s, "exec_not_found", tool, handle=handle,
                                      exec_id="exec_aaaaaaaa", **args)
                assert "rift_vm_exec_list" in error["hint"]
            gone = (await call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"]))["vm"]
            assert gone["status"] == "destroyed"
            second = (await call(s, "rift_vm_new", handle=handle))["vm"]

            released = await call(s, "rift_task_release", handle=handle)
            assert released["task"]["holder"] is None and released["task"]["status"] == "open"
            attached = await call(s, "rift_task_attach", task_id=task_id)
            assert attached["previous_holder"] is None
            closed = await call(s, "rift_task_close", handle=attached["handle"])
            assert closed["destroyed"] == [second["id"]]
            assert closed["task"]["close_reason"] == "closed"
            events = await call(s, "rift_task_events", task_id=task_id, limit=100)
            types_seen = [e["type"] for e in events["events"]]
            assert types_seen[0] == "opened" and types_seen[-1] == "vm_destroyed"
            assert {"vm_running", "released", "attached", "closed"} <= set(types_seen)
            page = await call(s, "rift_task_events", task_id=task_id, after_id=0, limit=2)
            assert page["has_more"] and len(page["events"]) == 2

            # Put away what an earlier conversation left behind, without its handle.
            left = await call(s, "rift_task_new", name="left behind")
            stray = (await call(s, "rift_vm_new", handle=left["handle"]))["vm"]
            await call(s, "rift_task_release", handle=left["handle"])
            assert (await call(s, "rift_vm_destroy", vm_id=stray["id"]))["vm"]["status"] \
                == "destroyed"
            put_away = await call(s, "rift_task_close", task_id=left["task"]["id"])
            assert put_away["task"]["status"] == "closed"

    run(scenario)


def test_the_server_log_holds_no_handle_and_no_token(server: Server) -> None:
    """Runs last in this module: everything above has been logged by now."""
    async def scenario() -> None:
        async with mcp_session(server.url, server.token, "quiet") as s:
            opened = await call(s, "rift_task_new", name="secret keeper")
            await refused(s, "lease_stale", "rift_task_get",
                          handle=opened["task"]["id"] + "." + "B" * 43)
            await call(s, "rift_task_close", handle=opened["handle"])

    run(scenario)
    log = server.log.read_text()
    assert '"door": "mcp"' in log  # the door does log
    assert server.token not in log and server.token[5:] not in log
    assert not re.search(r"task_[a-z2-7]{8}\.[A-Za-z0-9_-]{43}", log)
