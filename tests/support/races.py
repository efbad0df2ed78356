"""SDK clients racing to attach one released task: exactly one may win."""

from __future__ import annotations

import anyio
import mcp_types as types
from mcp.client.session import ClientSession

from tests.support.mcp_clients import call

CLIENTS = 20


async def race(owner: ClientSession, racers: list[ClientSession]) -> None:
    """One round: a released task, every racer attaching it at once without takeover."""
    opened = await call(owner, "rift_task_new", name="contested")
    task_id = opened["task"]["id"]
    await call(owner, "rift_task_release", handle=opened["handle"])
    go = anyio.Event()
    results: dict[int, types.CallToolResult] = {}

    async def attach(n: int, session: ClientSession) -> None:
        await go.wait()
        results[n] = await session.call_tool("rift_task_attach", {"task_id": task_id})

    async with anyio.create_task_group() as tg:
        for n, session in enumerate(racers):
            tg.start_soon(attach, n, session)
        await anyio.sleep(0.05)
        go.set()

    won = [n for n, r in results.items() if not r.is_error]
    lost = [(r.structured_content or {})["error"] for r in results.values() if r.is_error]
    assert len(won) == 1, [r.structured_content for r in results.values()]
    assert len(lost) == CLIENTS - 1
    assert {e["code"] for e in lost} == {"task_held"}
    assert {e["holder"] for e in lost} == {f"mcp:racer-{won[0]}"}
    winner = results[won[0]].structured_content or {}
    assert winner["task"]["holder"] == f"mcp:racer-{won[0]}"
    assert winner["previous_holder"] is None
    await call(racers[won[0]], "rift_task_close", handle=winner["handle"])
