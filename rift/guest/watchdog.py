"""Deadlines for SSH steps that have no timeout of their own.

paramiko waits without a timeout in a few places a guest controls: an exec
request the guest never answers (`Channel.exec_command`), a write the guest's
TCP window never takes (the packetizer retries forever), a close behind such a
write. A guest that stalls there would pin the calling thread for good (SPEC
§15). The watchdog is one thread that, for each guarded block still running at
its deadline, runs the block's action (closing the VM's connection): every
paramiko wait on that connection then ends with an error, and the call fails
with GuestError. Actions run on threads of their own, so one that blocks holds
up no other VM's deadline.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(order=True)
class Guard:
    """One guarded block: `fired` once its deadline passed while it ran."""

    deadline: float
    seq: int
    action: Callable[[], None] = field(compare=False)
    done: bool = field(default=False, compare=False)
    fired: bool = field(default=False, compare=False)


class Watchdog:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[Guard] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def guard(self, deadline: float, action: Callable[[], None]) -> Iterator[Guard]:
        """Run `action` (once, on another thread) if the block still runs at
        `deadline` (a `clock()` time)."""
        entry = Guard(deadline, next(self._seq), action)
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rift-guest-watchdog",
                                                daemon=True)
                self._thread.start()
            elif self._heap[0] is entry:
                self._cond.notify()
        try:
            yield entry
        finally:
            with self._cond:
                entry.done = True

    def pending(self) -> int:
        """Guarded blocks not yet ended or fired (for tests)."""
        with self._cond:
            return sum(1 for entry in self._heap if not entry.done)

    def stop(self) -> None:
        """End the thread (a later guard starts another); pending actions never run."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._heap.clear()
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._thread is not threading.current_thread():
                        return  # stopped
                    while self._heap and self._heap[0].done:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0].deadline - self._clock()
                    if wait <= 0:
                        entry = heapq.heappop(self._heap)
                        entry.fired = True
                        break
                    self._cond.wait(wait)
            threading.Thread(target=_act, args=(entry.action,), name="rift-guest-deadline",
                             daemon=True).start()


def _act(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # an action that fails has still done what it could
        log.warning("a guest call's deadline action failed", exc_info=True)
