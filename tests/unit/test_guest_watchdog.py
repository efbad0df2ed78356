"""Deadlines for SSH steps paramiko waits on without one (rift.guest.watchdog), and
the guest's text read without patterns (the standby shell's answer, a failed file
operation's reason)."""

from __future__ import annotations

import threading
import time

from rift.guest.scripts import _handed, shell_reason
from rift.guest.watchdog import Watchdog


def test_a_block_still_running_at_its_deadline_gets_its_action_run() -> None:
    dog = Watchdog()
    stuck = threading.Event()  # stands for a paramiko wait that only a close ends
    began = time.monotonic()
    with dog.guard(began + 0.1, stuck.set) as guard:
        assert stuck.wait(5)
    assert guard.fired and time.monotonic() - began < 4.0  # not at the wait's 5 s
    dog.stop()


def test_a_block_that_ends_in_time_is_left_alone() -> None:
    dog = Watchdog()
    acted = threading.Event()
    with dog.guard(time.monotonic() + 0.1, acted.set) as guard:
        pass
    assert not acted.wait(0.3) and not guard.fired and dog.pending() == 0
    dog.stop()


def test_an_action_that_blocks_holds_up_no_other_deadline() -> None:
    dog = Watchdog()
    never = threading.Event()
    second = threading.Event()

    def blocks() -> None:
        never.wait()

    now = time.monotonic()
    with dog.guard(now + 0.05, blocks), dog.guard(now + 0.1, second.set):
        assert second.wait(5)
    never.set()
    dog.stop()


def test_guards_after_a_stop_still_fire() -> None:
    dog = Watchdog()
    dog.stop()
    acted = threading.Event()
    with dog.guard(time.monotonic() + 0.05, acted.set):
        assert acted.wait(5)
    dog.stop()


def test_the_standby_answer_is_read_without_a_pattern() -> None:
    assert _handed(b"noise\nrift-handed-0\n") == 0
    assert _handed(b"rift-handed-x\nrift-handed-17\n") == 17
    assert _handed(b"rift-handed-1") is None  # not a whole line yet
    began = time.perf_counter()
    assert _handed(b"rift-handed-" * 1000) is None
    assert time.perf_counter() - began < 0.05


def test_a_failed_file_operation_gives_the_reason_without_shell_prefixes() -> None:
    assert shell_reason(b"sh: eval: line 1: can't create /x: nonexistent\n") == \
        "can't create /x: nonexistent"
    assert shell_reason(b"/bin/sh: line 3: /x: Is a directory") == "line 3: /x: Is a directory"
    assert shell_reason(b"cat: /x: No such file") == "cat: /x: No such file"
    began = time.perf_counter()
    assert len(shell_reason(b"sh" * 5_000_000)) == 500
    assert time.perf_counter() - began < 0.05
