"""Real MCP clients other than the Python SDK's, against a real `rift serve`: the
MCP Inspector CLI (@modelcontextprotocol/inspector, built on the TypeScript SDK's
client, which checks `structuredContent` against the tool's `outputSchema` also
on `isError` results, as Claude Code does), in both protocol eras."""

from __future__ import annotations

import pytest

from tests.support.js_clients import call_tool
from tests.support.servers import Server

ERAS = ("legacy", "modern")


@pytest.mark.parametrize("era", ERAS)
def test_a_validating_client_shows_a_refusal_with_its_code_and_hint(server: Server,
                                                                      era: str) -> None:
    opened = call_tool(server.url, server.token, era, "rift_task_new", name=f"checked {era}")
    assert not opened.get("isError"), opened
    handle = opened["structuredContent"]["handle"]
    closed = call_tool(server.url, server.token, era, "rift_task_close", handle=handle)
    assert not closed.get("isError") and closed["structuredContent"]["task"]["status"] == (
        "closed")
    # Before the output schemas admitted refusals, the client threw here: "data must have
    # required property 'task'", and the agent never saw the code or the hint.
    refused = call_tool(server.url, server.token, era, "rift_task_release", handle=handle)
    assert refused.get("isError") is True, refused
    error = refused["structuredContent"]["error"]
    assert error["code"] == "task_closed" and "rift_task_new" in error["hint"], error
    assert refused["content"][0]["text"].startswith(f"task_closed: {error['message']}")
    missing = call_tool(server.url, server.token, era, "rift_task_release")
    assert missing["structuredContent"]["error"]["code"] == "handle_required", missing


@pytest.mark.parametrize("era", ERAS)
def test_a_validating_client_accepts_every_kind_of_answer(server: Server, era: str) -> None:
    opened = call_tool(server.url, server.token, era, "rift_task_new")
    handle = opened["structuredContent"]["handle"]
    task_id = opened["structuredContent"]["task"]["id"]
    for tool, args in (("rift_task_get", {"handle": handle}),
                       ("rift_task_list", {}),
                       ("rift_task_events", {"task_id": task_id}),
                       ("rift_vm_new", {"handle": handle}),
                       ("rift_task_close", {"handle": handle})):
        answer = call_tool(server.url, server.token, era, tool, **args)
        assert "error" not in answer and not answer.get("isError"), (tool, answer)
        assert answer["structuredContent"], (tool, answer)
