"""Quotas and budgets through MCP, on a server started with small limits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.servers import Server, start_server, stop_server

VMS_PER_TASK = 2
TASKS_PER_HOUR = 3


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(tmp_path_factory.mktemp("rift-limited"),
                             RIFT_MAX_VMS_PER_TASK=str(VMS_PER_TASK),
                             RIFT_RATE_TASK_NEW_PER_H=str(TASKS_PER_HOUR))
    try:
        yield srv
    finally:
        stop_server(proc)


def test_more_vms_than_a_task_may_have_is_quota_exceeded(limited: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(limited.url, limited.token, "greedy") as s:
            opened = await call(s, "rift_task_new", name="full")
            handle = opened["handle"]
            vms = [(await call(s, "rift_vm_new", handle=handle))["vm"]["id"]
                   for _ in range(VMS_PER_TASK)]
            error = await refused(s, "quota_exceeded", "rift_vm_new", handle=handle)
            assert error["limit"] == VMS_PER_TASK and "rift_vm_destroy" in error["hint"]
            await call(s, "rift_vm_destroy", handle=handle, vm_id=vms[0])
            await call(s, "rift_vm_new", handle=handle)  # room again
            await call(s, "rift_task_close", handle=handle)

    run(scenario)


def test_more_task_creations_than_the_hourly_budget_is_rate_limited(limited: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(limited.url, limited.token, "hasty") as s:
            made = (await call(s, "rift_task_list", status="all", limit=100))["tasks"]
            for _ in range(TASKS_PER_HOUR - len(made)):
                await call(s, "rift_task_new")
            error = await refused(s, "rate_limited", "rift_task_new", name="one too many")
            assert 0 < error["retry_after_s"] <= 3600
            listed = await call(s, "rift_task_list", status="all", limit=100)
            assert "one too many" not in [t["name"] for t in listed["tasks"]]

    run(scenario)
