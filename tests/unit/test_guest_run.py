"""One command on a channel: output caps, the pid header, deadlines, dropped
connections, and the command line a guest shell runs (checked with local shells)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field

import pytest

from rift.guest.run import (
    Capped,
    Collected,
    Header,
    Reading,
    collect,
    command_line,
    feed_stdin,
    kill_line,
    send_within,
)


@dataclass
class FakeChannel:
    """Plays back stdout and stderr chunks, then EOF and an exit status."""

    stdout: deque[bytes] = field(default_factory=deque)
    stderr: deque[bytes] = field(default_factory=deque)
    status: int | None = 0
    closed: bool = False
    ends: bool = True  # False: the command never finishes
    sent: list[bytes] = field(default_factory=list)
    write_shut: bool = False
    window: int | None = None  # bytes the guest takes before it stops reading (None: all)
    timeout: float | None = None
    clock: Clock | None = None  # advanced by a send that waits for a window that never opens

    @property
    def eof_received(self) -> bool:
        return self.ends and not self.stdout and not self.stderr

    def recv_ready(self) -> bool:
        return bool(self.stdout)

    def recv(self, nbytes: int) -> bytes:
        return self.stdout.popleft()

    def recv_stderr_ready(self) -> bool:
        return bool(self.stderr)

    def recv_stderr(self, nbytes: int) -> bytes:
        return self.stderr.popleft()

    def exit_status_ready(self) -> bool:
        return self.closed or (self.eof_received and self.status is not None)

    def recv_exit_status(self) -> int:
        return -1 if self.status is None else self.status

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def send(self, s: bytes) -> int:
        """As paramiko's: what fits the window, else TimeoutError after the timeout."""
        room = len(s) if self.window is None else min(len(s), self.window)
        if room == 0:
            assert self.timeout is not None, "a send without a timeout would wait for good"
            if self.clock is not None:
                self.clock.now += self.timeout
            raise TimeoutError("no window")
        if self.window is not None:
            self.window -= room
        self.sent.append(bytes(s[:room]))
        return room

    def shutdown_write(self) -> None:
        self.write_shut = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds


def run(chan: FakeChannel, *, cap: int = 10, deadline: float = 60.0, alive: bool = True,
        header: bool = True) -> tuple[Clock, Collected]:
    clock = Clock()
    result = collect(chan, Reading(stdout_cap=cap, stderr_cap=cap, deadline=deadline,
                                   wait=clock.wait, alive=lambda: alive, clock=clock,
                                   sleep=clock.wait, header=header))
    return clock, result


def test_output_within_the_caps_comes_back_whole_with_the_exit_code() -> None:
    chan = FakeChannel(deque([b"hel", b"lo"]), deque([b"rift-exec 42\nwarn"]), status=3)
    _, result = run(chan)
    assert (result.stdout, result.stderr, result.exit_code) == (b"hello", b"warn", 3)
    assert result.pid == 42 and not result.truncated and not result.timed_out


def test_each_stream_is_capped_and_the_rest_is_drained_and_dropped() -> None:
    chan = FakeChannel(deque([b"a" * 8, b"b" * 8, b"c" * 100]),
                       deque([b"rift-exec 1\n", b"e" * 11]))
    _, result = run(chan)
    assert result.stdout == b"a" * 8 + b"bb" and result.stderr == b"e" * 10
    assert result.truncated and result.exit_code == 0
    assert not chan.stdout  # everything was read, so the command never blocked on a full pipe


def test_a_command_that_does_not_end_times_out_at_the_deadline() -> None:
    chan = FakeChannel(deque([b"partial"]), deque([b"rift-exec 7\n"]), ends=False)
    clock, result = run(chan, deadline=2.0)
    assert result.timed_out and result.exit_code is None
    assert result.stdout == b"partial" and result.pid == 7
    assert 2.0 <= clock.now < 2.6


def test_a_channel_closed_by_a_dead_connection_is_an_error() -> None:
    chan = FakeChannel(ends=False, status=None, closed=True)
    with pytest.raises(ConnectionError):
        run(chan, alive=False)


def test_a_channel_closed_without_status_on_a_live_connection_has_no_exit_code() -> None:
    _, result = run(FakeChannel(status=None, closed=True))
    assert result.exit_code is None and not result.timed_out


def test_a_connection_that_falls_while_waiting_is_an_error() -> None:
    with pytest.raises(ConnectionError):
        run(FakeChannel(ends=False), alive=False)


def test_the_header_is_passed_through_when_it_is_not_one() -> None:
    sink = Capped(100)
    head = Header(sink)
    head.feed(b"plain error\n")
    assert head.pid is None and sink.value() == b"plain error\n"
    sink2 = Capped(100)
    split = Header(sink2)
    for part in (b"rift-ex", b"ec 12", b"3\nafter"):
        split.feed(part)
    assert split.pid == 123 and sink2.value() == b"after"


def test_capped_counts_what_it_drops() -> None:
    capped = Capped(4)
    for part in (b"ab", b"cdef", b"gh"):
        capped.feed(part)
    assert (capped.value(), capped.dropped, capped.truncated) == (b"abcd", 4, True)


def test_stdin_is_sent_then_closed_and_no_stdin_closes_at_once() -> None:
    chan = FakeChannel()
    assert feed_stdin(chan, None, 60.0) is None and chan.write_shut
    chan = FakeChannel()
    thread = feed_stdin(chan, b"x" * 200_000, time.monotonic() + 60)
    assert thread is not None
    thread.join(5)
    assert b"".join(chan.sent) == b"x" * 200_000 and chan.write_shut


def test_input_a_guest_never_reads_fails_at_the_deadline_not_later() -> None:
    clock = Clock()
    chan = FakeChannel(window=100_000, clock=clock)
    with pytest.raises(TimeoutError):
        send_within(chan, b"x" * 1_000_000, 7.5, clock=clock)
    assert sum(map(len, chan.sent)) == 100_000
    assert clock.now == 7.5  # each wait was what was left of the deadline, no more


def test_a_stdin_thread_for_a_guest_that_never_reads_ends_at_the_deadline() -> None:
    chan = FakeChannel(window=0)
    thread = feed_stdin(chan, b"x" * 1_000_000, time.monotonic() + 0.05)
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and not chan.write_shut


SHELLS = [s for s in ("sh", "dash", "busybox") if shutil.which(s)]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "command",
    ["echo 'it''s'; echo \"$HOME\" >/dev/null; exit 3", "printf '%s\\n' a\\ b; (exit 3)",
     "if", "cat"],
)
def test_the_command_line_prints_its_pid_then_runs_the_command_as_sh_c_would(
    shell: str, command: str
) -> None:
    argv = [shell, "sh", "-c"] if shell == "busybox" else [shell, "-c"]
    plain = subprocess.run([*argv, command], input=b"in", capture_output=True, timeout=10,
                           check=False)
    wrapped = subprocess.run([*argv, command_line(command)], input=b"in", capture_output=True,
                             timeout=10, check=False)
    head, _, rest = wrapped.stderr.partition(b"\n")
    assert head.startswith(b"rift-exec ") and head[len(b"rift-exec "):].isdigit()
    assert (wrapped.returncode, wrapped.stdout) == (plain.returncode, plain.stdout)
    assert rest.replace(b"eval: ", b"").split(b":")[-1] == plain.stderr.split(b":")[-1]


def test_the_kill_line_names_the_process_its_group_and_its_children() -> None:
    line = kill_line(4321)
    assert "k 4321" in line and "kill -KILL -4321" in line and "/proc/$1/task/*/children" in line
