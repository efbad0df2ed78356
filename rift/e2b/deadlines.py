"""A sandbox's timeout, kept: at its end (create's `timeout`, moved by
`set_timeout` and `connect`) the sandbox is killed as `DELETE /sandboxes/{id}`
kills it (its task closed by `e2b:timeout`, its VM destroyed), as E2B does.

The ends live in this process's memory (rift.e2b.sandboxes.Registry), so this
process keeps them: a sweep each `EVERY_S`, started and stopped with the app
(its lifespan, wrapped when the door is mounted). A restart forgets them; Rift's
own rules for idle tasks still end a forgotten sandbox.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio

from rift.api.state import AppState
from rift.domain.errors import RiftError
from rift.e2b import sandboxes
from rift.e2b.sandboxes import Registry
from rift.services.context import Caller

EVERY_S = 1.0
ACTOR = "e2b:timeout"
log = logging.getLogger("rift.e2b")


def end_due(state: AppState, registry: Registry) -> list[str]:
    """Kill the sandboxes whose end has come; answers their ids. Blocking."""
    deps = state.deps
    ended = []
    for sandbox, owner in registry.due(deps.clock.now()):
        try:
            sandboxes.kill(deps, registry, Caller(owner, ACTOR), sandbox)
        except RiftError as exc:  # gone already (404), or the engine refused: drop it
            log.info("e2b sandbox timeout", extra={"sandbox": sandbox, "code": exc.code})
        registry.drop(sandbox)
        ended.append(sandbox)
    return ended


def with_deadlines(lifespan: Callable[[Any], AbstractAsyncContextManager[Any]],
                   state: AppState, registry: Registry,
                   ) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """`lifespan`, with the sweep running while the app serves."""
    @asynccontextmanager
    async def serving(app: Any) -> AsyncIterator[Any]:
        async with lifespan(app) as value, anyio.create_task_group() as group:
            group.start_soon(_sweep, state, registry)
            try:
                yield value
            finally:
                group.cancel_scope.cancel()
    return serving


async def _sweep(state: AppState, registry: Registry) -> None:
    while True:
        await anyio.sleep(EVERY_S)
        try:
            await anyio.to_thread.run_sync(end_due, state, registry)
        except Exception:  # a store hiccup: the next sweep tries again
            log.exception("e2b sandbox timeouts: the sweep failed")
