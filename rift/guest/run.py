"""Running one command on an open SSH channel: the guest-side command line,
stdin fed while output is read, each output stream capped, a deadline.

How a timeout kills: the command line first prints the login shell's pid on
stderr (a header the client strips), then `eval`s the command in that shell,
so the fast path costs one builtin and no extra process. At the deadline a
second channel stops and kills that process and, depth first, every process
below it (/proc/PID/task/*/children); when the pid also leads a process group
(OpenSSH gives each session one) the group is killed too. A process that was
orphaned before the deadline (a background job of a command that ended) is
not found: the call still ends at its deadline, since the channel is closed.

Pure of paramiko: the channel is anything with paramiko's Channel methods, so
tests drive it with a fake.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

CHUNK = 64 * 1024
_POLL_S = 0.5
_DROP_GRACE_S = 0.5


class Channel(Protocol):
    """The part of paramiko.Channel used here."""

    @property
    def eof_received(self) -> bool | int: ...
    @property
    def closed(self) -> bool: ...
    def recv_ready(self) -> bool: ...
    def recv(self, nbytes: int) -> bytes: ...
    def recv_stderr_ready(self) -> bool: ...
    def recv_stderr(self, nbytes: int) -> bytes: ...
    def exit_status_ready(self) -> bool: ...
    def recv_exit_status(self) -> int: ...
    def send(self, s: bytes) -> int: ...
    def settimeout(self, timeout: float | None) -> None: ...
    def shutdown_write(self) -> None: ...


HEADER = b"rift-exec "


def command_line(command: str) -> str:
    """What the guest's login shell runs for `command`: a pid header on stderr, then it."""
    return f"printf 'rift-exec %s\\n' $$ >&2; eval {shlex.quote(command)}"


def kill_line(pid: int) -> str:
    """Kills `pid` and everything below it, and the group it leads if it leads one."""
    return (
        "k() { kill -STOP $1 2>/dev/null; "
        "for c in $(cat /proc/$1/task/*/children 2>/dev/null); do k $c; done; "
        "kill -KILL $1 2>/dev/null; }; "
        f"k {pid}; kill -KILL -{pid} 2>/dev/null; true"
    )


class Header:
    """Takes the `rift-exec <pid>` line off the front of stderr."""

    def __init__(self, sink: Capped) -> None:
        self.sink = sink
        self.pid: int | None = None
        self._buffer = b""
        self._done = False

    def feed(self, data: bytes) -> None:
        if self._done:
            self.sink.feed(data)
            return
        self._buffer += data
        line, newline, rest = self._buffer.partition(b"\n")
        if not newline:
            if len(self._buffer) > 64:  # not a header after all: pass it through
                self._finish(self._buffer)
            return
        if line.startswith(HEADER) and line[len(HEADER):].isdigit():
            self.pid = int(line[len(HEADER):])
            self._finish(rest)
        else:
            self._finish(self._buffer)

    def _finish(self, data: bytes) -> None:
        self._done = True
        self._buffer = b""
        if data:
            self.sink.feed(data)

    def flush(self) -> None:
        if not self._done and self._buffer:
            self._finish(self._buffer)


class Capped:
    """Keeps the first `cap` bytes of a stream and counts the rest away."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._parts: list[bytes] = []
        self.kept = 0
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.cap - self.kept
        if room > 0:
            part = data[:room]
            self._parts.append(part)
            self.kept += len(part)
        self.dropped += max(0, len(data) - max(room, 0))

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def value(self) -> bytes:
        return b"".join(self._parts)


@dataclass(frozen=True)
class Collected:
    stdout: bytes
    stderr: bytes
    truncated: bool
    exit_code: int | None  # None: the deadline came first, or the guest sent none
    timed_out: bool
    pid: int | None = None  # from the stderr header, when asked for one


def send_within(chan: Channel, data: bytes, deadline: float, *,
                clock: Callable[[], float] = time.monotonic) -> None:
    """Send all of `data` by `deadline`, a chunk at a time, each waiting for the
    guest's window no longer than what is left (TimeoutError past it): a guest
    that never reads its stdin costs the call its deadline, not a thread for good.
    ConnectionError when the channel closed first."""
    sent = 0
    while sent < len(data):
        remaining = deadline - clock()
        if remaining <= 0:
            raise TimeoutError("the guest did not take its input in time")
        chan.settimeout(remaining)
        count = chan.send(data[sent:sent + CHUNK])
        if count <= 0:
            raise ConnectionError("the channel closed while its input was sent")
        sent += count


def feed_stdin(chan: Channel, data: bytes | None, deadline: float) -> threading.Thread | None:
    """Send `data` then EOF by `deadline`; in a thread when there is data, so output
    is read meanwhile."""
    if not data:
        chan.shutdown_write()
        return None

    def send() -> None:
        try:
            send_within(chan, data, deadline)
            chan.shutdown_write()
        except Exception:  # the command stopped reading, or the channel closed: nothing to do
            return

    thread = threading.Thread(target=send, name="rift-guest-stdin", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Reading:
    """How `collect` reads a channel: each stream's cap, the monotonic deadline, how
    it waits for news and asks whether the connection stands, its clock and sleep
    (fakes in tests), and whether stderr starts with the `rift-exec <pid>` header."""

    stdout_cap: int
    stderr_cap: int
    deadline: float
    wait: Callable[[float], None]
    alive: Callable[[], bool]
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    header: bool = False


def collect(chan: Channel, reading: Reading) -> Collected:
    """Read both streams until the command is done (EOF and exit status) or `deadline`.

    `wait(seconds)` blocks until the channel may have news; `alive()` says
    whether the connection under the channel still stands (ConnectionError
    when it falls). With `header`, the first stderr line is the `rift-exec
    <pid>` header that `command_line` prints, taken off into `.pid`.
    """
    stdout_cap, stderr_cap, deadline = reading.stdout_cap, reading.stderr_cap, reading.deadline
    wait, alive, clock, sleep = reading.wait, reading.alive, reading.clock, reading.sleep
    header = reading.header
    out, err = Capped(stdout_cap), Capped(stderr_cap)
    head = Header(err)
    err_sink: Capped | Header = head if header else err
    while True:
        progressed = False
        if chan.recv_ready():
            out.feed(chan.recv(CHUNK))
            progressed = True
        if chan.recv_stderr_ready():
            err_sink.feed(chan.recv_stderr(CHUNK))
            progressed = True
        if progressed:
            continue
        finished = chan.exit_status_ready() and (bool(chan.eof_received) or chan.closed)
        if finished or chan.closed:
            # paramiko answers -1 when no exit status came (a closed channel is "ready").
            status = chan.recv_exit_status() if chan.exit_status_ready() else -1
            if status < 0 and _dropped(alive, clock, sleep):
                raise ConnectionError("the SSH connection dropped during the command")
            code = status if status >= 0 else None
            head.flush()
            return Collected(out.value(), err.value(), out.truncated or err.truncated,
                             code, timed_out=False, pid=head.pid)
        remaining = deadline - clock()
        if remaining <= 0:
            head.flush()
            return Collected(out.value(), err.value(), out.truncated or err.truncated,
                             None, timed_out=True, pid=head.pid)
        if not alive():
            raise ConnectionError("the SSH connection dropped during the command")
        wait(min(remaining, _POLL_S))


def _dropped(alive: Callable[[], bool], clock: Callable[[], float],
             sleep: Callable[[float], None]) -> bool:
    """Whether the connection fell: a channel closed without an exit status may be
    the first sign (paramiko closes the channels just before it marks the
    connection dead), so look again for a moment."""
    until = clock() + _DROP_GRACE_S
    while alive():
        if clock() >= until:
            return False
        sleep(0.01)
    return True
