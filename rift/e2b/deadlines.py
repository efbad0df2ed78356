"""A sandbox's timeout, kept: at its end (create's `timeout`, moved by
`set_timeout` and `connect`) the sandbox is killed as `DELETE /sandboxes/{id}`
kills it (its task closed by `e2b:timeout`, its VM destroyed), as E2B does.

The ends are in the store (tx.sandboxes), so any replica's sweep finds them, and
a restart keeps them: a sweep each `EVERY_S`, started and stopped with the app
(its lifespan, wrapped when the door is mounted). Two replicas racing to end the
same sandbox end it once (the task closes once; the other finds it gone).

A sandbox made with `autoPause` (`on_timeout` `pause`) is not killed at its end:
it is put to sleep (SPEC §17) by `sleep_at_end`, and any call that needs it wakes
it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio

from hypervisor.base import HypervisorError
from rift.api.state import AppState
from rift.domain.errors import RiftError, StoreUnavailable
from rift.domain.sandboxes import Sandbox
from rift.e2b import sandboxes, shapes
from rift.e2b.sandboxes import Registry
from rift.services.context import Caller, Deps
from rift.services.lifecycle import sleeps

EVERY_S = 1.0
BATCH = 50
ACTOR = "e2b:timeout"
log = logging.getLogger("rift.e2b")


def sleep_at_end(deps: Deps, record: Sandbox) -> None:
    """`autoPause`: the sandbox's VM goes to sleep at its end (SPEC §17: its next call
    wakes it), and its end is dropped; a VM that cannot sleep now (paused, changing,
    its host short of disk) runs on, ended by Rift's own rules for idle tasks. A VM
    gone takes its record with it."""
    with deps.store.read() as tx:
        vm = tx.vms.get(record.vm_id)
    if vm is not None and vm.is_live:
        try:
            sleeps.sleep_vm(deps, record.vm_id, ACTOR, "the sandbox's end (autoPause)")
        except HypervisorError as exc:  # libvirt refused the save: the VM runs on
            log.warning("e2b sandbox end: could not sleep", extra={
                "sandbox": shapes.sandbox_id(record.vm_id), "error": str(exc)})
    with deps.store.write() as tx:
        if vm is None or not vm.is_live:
            tx.sandboxes.remove(record.vm_id)
        else:
            tx.sandboxes.set_end(record.vm_id, None)


def end_due(deps: Deps, registry: Registry) -> list[str]:
    """End the sandboxes whose end has come; answers their ids. Blocking."""
    with deps.store.read() as tx:
        due = tx.sandboxes.due(deps.clock.now(), BATCH)
    ended = []
    for record in due:
        sandbox = shapes.sandbox_id(record.vm_id)
        if record.on_timeout == "pause":
            sleep_at_end(deps, record)
            continue
        try:
            sandboxes.kill(deps, registry, Caller(record.owner, ACTOR), sandbox)
        except RiftError as exc:  # gone already (404), or the engine refused: drop it
            log.info("e2b sandbox timeout", extra={"sandbox": sandbox, "code": exc.code})
        sandboxes.forget(deps, registry, record.vm_id)
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
            await anyio.to_thread.run_sync(end_due, state.deps, registry)
        except StoreUnavailable:  # said once per interval, without a traceback, as sweeps do
            log.warning("e2b sandbox timeouts: skipped, the database did not answer")
        except Exception:  # the next sweep tries again
            log.exception("e2b sandbox timeouts: the sweep failed")
