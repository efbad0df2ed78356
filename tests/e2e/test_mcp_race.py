"""Twenty SDK clients race to attach one released task: exactly one wins."""

from __future__ import annotations

from contextlib import AsyncExitStack

from tests.support.mcp_clients import ERAS, mcp_session, run
from tests.support.races import CLIENTS, race
from tests.support.servers import Server

ROUNDS = 3


def test_twenty_clients_attach_a_released_task_and_exactly_one_wins(server: Server) -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            owner = await stack.enter_async_context(mcp_session(server.url, server.token))
            # Both eras race: every other client speaks the handshake era.
            racers = [await stack.enter_async_context(mcp_session(
                server.url, server.token, f"racer-{n}", ERAS[n % 2])) for n in range(CLIENTS)]
            for _ in range(ROUNDS):
                await race(owner, racers)

    run(scenario, limit_s=60)
