"""One budget of waiting calls per user, and threads of their own (SPEC §15).

A waiting call is one that may hold on for seconds or minutes: an exec that
waits for its command's end, a long poll (`wait_s`), a VM's boot, an exec's
event stream, an MCP task working, a `subscriptions/listen`, an open Boxes
page's live stream. Each user may have `RIFT_MAX_WAITING_PER_USER` of them at
once on a replica; one more is refused `rate_limited` at once.

The blocking ones run on `WAIT_THREADS` threads of their own (an anyio
`CapacityLimiter`), never on the default pool that plain routes and short
tool calls share: however many calls wait, short calls find their threads free.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from rift.domain.errors import TooManyWaiting

T = TypeVar("T")
WAIT_THREADS = 256  # all users' waiting calls at once on a replica, as threads


class Waiting:
    def __init__(self, per_user: int, threads: int = WAIT_THREADS) -> None:
        self.per_user = per_user
        self.limiter = anyio.CapacityLimiter(threads)
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def held(self, user: str) -> int:
        with self._lock:
            return self._held.get(user, 0)

    def take(self, user: str) -> Callable[[], None]:
        """One of the user's places, or `TooManyWaiting`; answers the function that
        gives it back (only the first call of it counts)."""
        with self._lock:
            if self._held.get(user, 0) >= self.per_user:
                raise TooManyWaiting(self.per_user)
            self._held[user] = self._held.get(user, 0) + 1
        given = threading.Event()

        def give() -> None:
            with self._lock:
                if given.is_set():
                    return
                given.set()
                left = self._held.get(user, 1) - 1
                if left > 0:
                    self._held[user] = left
                else:
                    self._held.pop(user, None)
        return give

    @contextmanager
    def hold(self, user: str) -> Iterator[None]:
        give = self.take(user)
        try:
            yield
        finally:
            give()

    async def run(self, user: str | None, work: Callable[..., T], *args: Any,
                  abandon_on_cancel: bool = False) -> T:
        """`work(*args)` on the waiting calls' threads, holding one of `user`'s
        places while it runs (no place when `user` is None: a call that turned out
        not to wait)."""
        if user is None:
            return await anyio.to_thread.run_sync(work, *args, limiter=self.limiter,
                                                  abandon_on_cancel=abandon_on_cancel)
        with self.hold(user):
            return await anyio.to_thread.run_sync(work, *args, limiter=self.limiter,
                                                  abandon_on_cancel=abandon_on_cancel)

    async def iterate(self, items: Iterator[T]) -> AsyncIterator[T]:
        """A blocking iterator's items, each fetched on the waiting calls' threads.
        A generator left early (its client went) is closed on those threads too: its
        `finally` may call the guest (an E2B watch kills its watcher), which must
        not hold the event loop and every other call with it."""
        def step() -> tuple[bool, T | None]:
            for item in items:
                return True, item
            return False, None

        try:
            while True:
                more, item = await anyio.to_thread.run_sync(step, limiter=self.limiter)
                if not more:
                    return
                yield item  # type: ignore[misc]  # a T whenever `more`
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(close, limiter=self.limiter)


class HeldStream(StreamingResponse):
    """A streaming answer that gives its place back when it ends, however it ends
    (even if the client went away before its first byte)."""

    def __init__(self, content: Any, give: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.give = give

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.give()
