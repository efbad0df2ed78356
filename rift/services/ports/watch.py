"""What a door sees of a call that waits (SPEC §10): an exec's end, a long poll,
a VM's boot. The engine call runs in a worker thread and tells its `Watch` what
it made (`begun`: the exec or VM id) and its newest news (`note`: an output line,
a boot stage); the door reads both to send progress or a task's status, and
`stop`s the wait when its caller cancels (the door then kills the exec or
destroys the VM: a cancel is a call of its own, under the same handle).

The engine waits in steps of at most `STEP_S` when a call is watched, so the
news is never older than a step and a stopped wait ends within one.
"""

from __future__ import annotations

import threading
import time

STEP_S = 5.0  # the longest single wait on a guest while a call is watched
LINE_MAX = 200  # the most of an output line a note keeps


class Watch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.started = time.monotonic()
        self.target: str | None = None  # the exec or VM this call made, once it has
        self.message = ""
        self.version = 0  # counts notes: a door sends only news

    def begun(self, target: str) -> None:
        with self._lock:
            self.target = target

    def note(self, message: str) -> None:
        message = message[:LINE_MAX]
        with self._lock:
            if message and message != self.message:
                self.message = message
                self.version += 1

    def stop(self) -> None:
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def status(self) -> str:
        """A line for people: the seconds since the call began and the newest news."""
        with self._lock:
            message = self.message
        elapsed = f"{self.elapsed_s():.0f} s"
        return f"{elapsed}: {message}" if message else elapsed


def newest_line(data: bytes) -> str:
    """The last line of output that has any text, stripped (invalid UTF-8 replaced)."""
    text = data.decode("utf-8", "replace")
    for line in reversed(text.replace("\r", "\n").split("\n")):
        if line.strip():
            return line.strip()
    return ""
