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
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel
from starlette.requests import Request

from rift.api.mcp.callers import caller_of
from rift.api.mcp.tools import Tool, Waits
from rift.api.waiting import Waiting
from rift.contract.code import VmRunCodeIn
from rift.contract.execs import VmExecIn
from rift.domain.errors import RiftError
from rift.services.context import Caller, Deps
from rift.services.ports.watch import Watch

log = logging.getLogger("rift.api.mcp")

PROGRESS_FIRST_S = 1.0  # a call still working after a second says so
PROGRESS_EVERY_S = 5.0


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


@dataclass(frozen=True)
class WatchedCall:
    """One call of a waiting tool: who asked, with what, under which watch."""

    tool: Tool
    caller: Caller
    args: Any
    watch: Watch

    @property
    def waits(self) -> Waits:
        assert self.tool.waits is not None
        return self.tool.waits


def run_watched(deps: Deps, call: WatchedCall, stop_after: bool) -> BaseModel:
    """The call itself (in a worker thread); if it was stopped, end what it made."""
    try:
        return call.waits.call(deps, call.caller, call.args, call.watch)
    finally:
        if stop_after and call.watch.stopped and call.watch.target is not None:
            end_made(deps, call, getattr(call.args, "handle", None), call.watch.target)


def end_made(deps: Deps, call: WatchedCall, handle: str | None, target: str) -> None:
    tool = call.tool.name
    try:
        call.waits.stop(deps, call.caller, handle, target)
        log.info("cancelled", extra={"door": "mcp", "tool": tool, "target": target})
    except RiftError as exc:  # e.g. the lease moved on: then nothing changes
        log.info("cancel refused", extra={"door": "mcp", "tool": tool, "code": exc.code})


def wait_total_s(args: Any, deps: Deps) -> float | None:
    wait = getattr(args, "wait_s", None)
    if isinstance(args, VmExecIn | VmRunCodeIn) and wait is None:
        return float(deps.limits.exec_wait_s)
    return float(wait) if wait is not None else None


@dataclass(frozen=True)
class PlainCalls:
    """What a plain waiting call needs of the door: the engine, this replica's calls
    in flight, and the waiting calls' budget."""

    deps: Deps
    in_flight: InFlight
    waiting: Waiting


async def plain_call(door: PlainCalls, ctx: ServerRequestContext[Any, Any], tool: Tool,
                     caller: Caller, args: Any) -> BaseModel:
    """A waiting call answered on its own request, with progress while it waits. It
    runs on the waiting calls' threads and, unless it asks for no wait at all
    (`wait_s` 0), holds one of the caller's places (rift/api/waiting.py)."""
    call = WatchedCall(tool, caller, args, Watch())
    total = wait_total_s(args, door.deps)
    place = door.waiting.take(caller.user) if total is None or total > 0 else None
    try:
        return await _watched_call(door, ctx, call, total)
    finally:
        if place is not None:
            place()


async def _watched_call(door: PlainCalls, ctx: ServerRequestContext[Any, Any], call: WatchedCall,
                        total: float | None) -> BaseModel:
    watch, in_flight = call.watch, door.in_flight
    wants_progress = bool(ctx.meta and ctx.meta.get("progress_token") is not None)

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
                    run_watched, door.deps, call, call.waits.plain_cancel_stops,
                    abandon_on_cancel=True, limiter=door.waiting.limiter)
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
