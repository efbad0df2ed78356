"""Plain MCP calls that wait (SPEC §10): `rift_vm_exec`, `rift_vm_exec_get` and
`rift_vm_new` run in a worker thread under a `Watch` (rift/services/ports/watch.py),
so the door can say how they go and stop them.

- **Progress.** A request whose `_meta` carries a `progressToken` gets
  `notifications/progress` after `PROGRESS_FIRST_S`, then every
  `PROGRESS_EVERY_S` (well within the 15 s of SPEC §10): `progress` is the
  seconds waited, `total` the most it will wait, `message` the seconds and the
  newest output line (or the boot stage). Claude Code drops a call after 5
  minutes with neither progress nor answer.
- **Cancel.** On 2026-07-28 the SDK cancels a handler whose caller closes the
  call's stream. In the handshake era Rift runs stateless, so a
  `notifications/cancelled` comes on a request of its own, which the SDK cannot
  match to the call; `InFlight` does, by the caller's user, the `Mcp-Session-Id`
  the client echoes and the request id (on this replica). A bare disconnect in
  the handshake era cancels nothing (the SDK's transport cancels that handler
  too; Rift lets its call run on). A cancelled
  `rift_vm_exec` kills its command and a cancelled `rift_vm_new` destroys its
  VM, under the call's own handle, in the worker thread once its wait ends (at
  most a step later). A cancelled `rift_vm_exec_get` only stops polling: the
  command is another call's, and a client that drops a long poll has not asked
  for the build to die.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel
from starlette.requests import Request

from rift.api.mcp.callers import caller_of
from rift.api.waiting import Waiting
from rift.domain.errors import RiftError
from rift.services.context import Caller, Deps
from rift.services.lifecycle.tools import WATCHED, stop_made
from rift.services.ports.watch import Watch

log = logging.getLogger("rift.api.mcp")

PROGRESS_FIRST_S = 1.0  # a call still working after a second says so
PROGRESS_EVERY_S = 5.0
KILLED_ON_CANCEL = frozenset({"rift_vm_exec", "rift_vm_new"})


Key = tuple[str, str | None, types.RequestId]  # user, Mcp-Session-Id, request id


class InFlight:
    """The handshake era's plain waiting calls of this replica, by `Key`, so that a
    `notifications/cancelled` on another request can cancel one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Key, anyio.CancelScope] = {}

    @staticmethod
    def key(ctx: ServerRequestContext[Any, Any], request_id: types.RequestId | None,
            ) -> Key | None:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or request_id is None:
            return None  # 2026-07-28: closing the stream is the cancel
        session = ctx.request.headers.get("mcp-session-id") if isinstance(ctx.request, Request) \
            else None
        return caller_of(ctx).user, session, request_id

    @contextmanager
    def track(self, key: Key | None) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            if key is not None:
                with self._lock:
                    self._calls[key] = scope
            try:
                yield scope
            finally:
                if key is not None:
                    with self._lock:
                        if self._calls.get(key) is scope:
                            del self._calls[key]

    async def cancelled(self, ctx: ServerRequestContext[Any, Any],
                        params: types.CancelledNotificationParams) -> None:
        """The `notifications/cancelled` handler."""
        key = self.key(ctx, params.request_id)
        with self._lock:
            scope = self._calls.get(key) if key is not None else None
        if scope is not None:
            scope.cancel()


def run_watched(deps: Deps, tool: str, caller: Caller, args: Any, watch: Watch,
                stop_after: bool) -> BaseModel:
    """The call itself (in a worker thread); if it was stopped, end what it made."""
    try:
        answer: BaseModel = WATCHED[tool](deps, caller, args, watch)
        return answer
    finally:
        if stop_after and watch.stopped and watch.target is not None:
            end_made(deps, caller, tool, getattr(args, "handle", None), watch.target)


def end_made(deps: Deps, caller: Caller, tool: str, handle: str | None, target: str) -> None:
    try:
        stop_made(deps, caller, tool, handle, target)
        log.info("cancelled", extra={"door": "mcp", "tool": tool, "target": target})
    except RiftError as exc:  # e.g. the lease moved on: then nothing changes
        log.info("cancel refused", extra={"door": "mcp", "tool": tool, "code": exc.code})


def wait_total_s(tool: str, args: Any, deps: Deps) -> float | None:
    wait = getattr(args, "wait_s", None)
    if tool == "rift_vm_exec" and wait is None:
        return float(deps.limits.exec_wait_s)
    return float(wait) if wait is not None else None


async def plain_call(deps: Deps, ctx: ServerRequestContext[Any, Any], tool: str,
                     caller: Caller, args: Any, in_flight: InFlight,
                     waiting: Waiting) -> BaseModel:
    """A waiting call answered on its own request, with progress while it waits. It
    runs on the waiting calls' threads and, unless it asks for no wait at all
    (`wait_s` 0), holds one of the caller's places (rift/api/waiting.py)."""
    watch = Watch()
    wants_progress = bool(ctx.meta and ctx.meta.get("progress_token") is not None)
    total = wait_total_s(tool, args, deps)
    place = waiting.take(caller.user) if total is None or total > 0 else None
    try:
        return await _watched_call(deps, ctx, tool, caller, args, in_flight, waiting, watch,
                                   wants_progress, total)
    finally:
        if place is not None:
            place()


async def _watched_call(deps: Deps, ctx: ServerRequestContext[Any, Any], tool: str,
                        caller: Caller, args: Any, in_flight: InFlight, waiting: Waiting,
                        watch: Watch, wants_progress: bool, total: float | None) -> BaseModel:

    async def progress() -> None:
        await anyio.sleep(PROGRESS_FIRST_S)
        while True:
            await ctx.session.report_progress(round(watch.elapsed_s(), 1), total,
                                              watch.status())
            await anyio.sleep(PROGRESS_EVERY_S)

    failed: Exception | None = None
    modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    with in_flight.track(in_flight.key(ctx, ctx.request_id)) as scope:
        async with anyio.create_task_group() as tg:
            if wants_progress:
                tg.start_soon(progress)
            try:
                answer = await anyio.to_thread.run_sync(
                    run_watched, deps, tool, caller, args, watch, tool in KILLED_ON_CANCEL,
                    abandon_on_cancel=True, limiter=waiting.limiter)
            except anyio.get_cancelled_exc_class():
                # The thread ends its wait within a step, then ends what it made. In the
                # handshake era only notifications/cancelled (this scope) stops it: the
                # transport cancels a call whose client merely went away, too.
                if modern or scope.cancel_called:
                    watch.stop()
                raise
            except Exception as exc:  # raised out of the group, not as an ExceptionGroup
                failed = exc
            finally:
                tg.cancel_scope.cancel()
    if scope.cancelled_caught:  # by notifications/cancelled: the client reads no answer
        raise MCPError(types.INVALID_REQUEST, "the call was cancelled")
    if failed is not None:
        raise failed
    return answer
