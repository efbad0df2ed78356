"""`rift-exec`, the guest half of execs (SPEC §10), compiled as the images get it
and run here on the host, as the guest's login shell would run it: a command
that outlives the call that started it, its output kept in rings of a fixed
size, its stdin fed and closed, its process group killed whole, its timeout,
its keeper's death seen as `lost`, and fifty at once. Rift's side of the
protocol (rift.guest.exec_view) reads every answer."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypervisor.exec_helper import exec_helper
from rift.guest.exec_view import (
    EXEC_ENDED,
    input_command,
    kill_command,
    parse_view,
    read_command,
    start_command,
)
from rift.services.ports import ExecRead, ExecStart, GuestExec
from tests.support.cache import CACHE

MIB = 1 << 20


@pytest.fixture(scope="module")
def helper() -> str:
    return str(exec_helper(CACHE / "helpers"))


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Execs live under here instead of the guest's /run/rift-exec."""
    monkeypatch.setattr("rift.guest.exec_view.EXECS_DIR", str(tmp_path / "execs"))
    yield tmp_path / "execs"
    for pid_file in (tmp_path / "execs").glob("*/pid"):  # no keeper outlives its test
        keeper, child = (int(v) for v in pid_file.read_text().split()[:2])
        for pid in (-child, keeper):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _shell(line: str, stdin: bytes | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["/bin/sh", "-c", line], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh"})


def start(helper: str, exec_id: str, command: str, *, timeout_s: int = 60,
          cap: int = MIB, wait_ms: int = 5000, max_bytes: int = MIB,
          stdin: bytes | None = None) -> GuestExec:
    proc = _shell(start_command(ExecStart(
        exec_id=exec_id, command=command, stdin=stdin, timeout_s=timeout_s, cap_bytes=cap,
        wait_ms=wait_ms, max_bytes=max_bytes), helper=helper))
    out, err = proc.communicate(stdin, timeout=wait_ms / 1000 + 30)
    assert proc.returncode == 0, err
    return parse_view(out, max_bytes)


def read(helper: str, exec_id: str, out: int = 0, err: int = 0, wait_ms: int = 0,
         max_bytes: int = MIB) -> GuestExec:
    proc = _shell(read_command(ExecRead(exec_id=exec_id, stdout_offset=out, stderr_offset=err,
                                        max_bytes=max_bytes, wait_ms=wait_ms), helper=helper))
    answer, _ = proc.communicate(timeout=30)
    return parse_view(answer, max_bytes)


def feed(helper: str, exec_id: str, data: bytes, eof: bool = False) -> int:
    proc = _shell(input_command(exec_id, eof=eof, helper=helper))
    proc.communicate(data, timeout=10)
    return proc.returncode


def kill(helper: str, exec_id: str, sig: str = "TERM") -> int:
    proc = _shell(kill_command(exec_id, sig, helper=helper))  # type: ignore[arg-type]
    proc.communicate(timeout=10)
    return proc.returncode


def until_ended(helper: str, exec_id: str, within_s: float = 20) -> GuestExec:
    deadline = time.monotonic() + within_s
    while True:
        view = read(helper, exec_id, wait_ms=500)
        if view.state != "running":
            return view
        assert time.monotonic() < deadline, view


def test_a_short_command_answers_its_end_and_both_streams(helper: str, root: Path) -> None:
    view = start(helper, "exec_a", "echo hello; echo oops >&2; exit 3")
    assert (view.state, view.exit_code, view.signal) == ("ended", 3, None)
    assert (view.stdout, view.stderr) == (b"hello\n", b"oops\n")
    assert (view.stdout_total, view.stderr_total, view.timed_out, view.killed) == \
        (6, 5, False, False)
    assert view.ended_ms is not None and view.ended_ms >= view.started_ms


def test_a_command_outlives_the_call_and_a_long_poll_sees_its_output(
        helper: str, root: Path) -> None:
    view = start(helper, "exec_b", "sleep 0.5; echo one; sleep 0.5; echo two", wait_ms=0)
    assert view.state == "running" and view.exit_code is None and view.stdin_open
    first = read(helper, "exec_b", wait_ms=5000)  # waits for the first line
    assert first.stdout == b"one\n" and first.state == "running"
    rest = read(helper, "exec_b", out=first.stdout_total, wait_ms=5000)
    assert rest.stdout == b"two\n" and rest.stdout_from == 4
    ended = until_ended(helper, "exec_b")
    assert (ended.state, ended.exit_code, ended.stdout) == ("ended", 0, b"one\ntwo\n")


def test_the_ring_keeps_the_newest_bytes_of_a_large_output(helper: str, root: Path) -> None:
    # 4 MiB through a 64 KiB ring: the guest holds 64 KiB, the totals count all.
    view = start(helper, "exec_c", "head -c 4194304 /dev/zero | tr '\\0' x; echo end",
                 cap=64 * 1024, wait_ms=20000)
    assert view.state == "ended" and view.stdout_total == 4 * MIB + 4
    assert view.stdout_from == view.stdout_total - 64 * 1024
    assert len(view.stdout) == 64 * 1024 and view.stdout.endswith(b"xxend\n")
    again = read(helper, "exec_c", out=10)  # an offset the ring no longer holds
    assert again.stdout_from == view.stdout_from
    capped = read(helper, "exec_c", out=view.stdout_total - 100, max_bytes=40)
    assert (capped.stdout_from, len(capped.stdout)) == (view.stdout_total - 100, 40)
    assert (root / "exec_c" / "out").stat().st_size == 8 + 64 * 1024


def test_input_reaches_stdin_and_eof_ends_it(helper: str, root: Path) -> None:
    view = start(helper, "exec_d", "cat; echo cat-ended", wait_ms=200)
    assert view.state == "running" and view.stdin_open
    assert feed(helper, "exec_d", b"abc") == 0
    assert feed(helper, "exec_d", b"x" * 100000 + b"\n", eof=True) == 0
    ended = until_ended(helper, "exec_d")
    assert ended.stdout == b"abc" + b"x" * 100000 + b"\ncat-ended\n"
    assert not ended.stdin_open
    assert feed(helper, "exec_d", b"late") == EXEC_ENDED


def test_stdin_given_at_the_start_is_read_then_closed(helper: str, root: Path) -> None:
    view = start(helper, "exec_e", "wc -c", stdin=b"12345")
    assert view.state == "ended" and view.stdout.strip() == b"5"


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group runs (zombies aside)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_a_kill_takes_the_whole_process_group_even_what_ignores_term(
        helper: str, root: Path) -> None:
    start(helper, "exec_f", "sh -c 'trap \"\" TERM; sleep 1000' & sleep 1000", wait_ms=300)
    child = int((root / "exec_f" / "pid").read_text().split()[1])
    assert _group_alive(child)
    assert kill(helper, "exec_f", "TERM") == 0
    ended = until_ended(helper, "exec_f")
    assert ended.state == "ended" and ended.killed and ended.signal == signal.SIGTERM
    assert not _group_alive(child)  # the TERM-ignoring child got KILL 5 s on
    assert kill(helper, "exec_f", "KILL") == 0  # a repeat changes nothing
    assert read(helper, "exec_f").ended_ms == ended.ended_ms


def test_a_timeout_kills_and_says_so(helper: str, root: Path) -> None:
    view = start(helper, "exec_g", "echo started; sleep 30", timeout_s=1, wait_ms=10000)
    assert view.state == "ended" and view.timed_out and view.signal == signal.SIGTERM
    assert view.stdout == b"started\n" and view.exit_code is None


def test_a_keeper_killed_leaves_the_exec_lost(helper: str, root: Path) -> None:
    start(helper, "exec_h", "sleep 30", wait_ms=0)
    keeper = int((root / "exec_h" / "pid").read_text().split()[0])
    os.kill(keeper, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while read(helper, "exec_h").state != "lost":
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_an_unknown_exec_is_exit_status_3(helper: str, root: Path) -> None:
    proc = _shell(read_command(ExecRead(exec_id="exec_none", max_bytes=10), helper=helper))
    proc.communicate(timeout=10)
    assert proc.returncode == 3


def test_fifty_execs_at_once_each_end_with_their_own_output(helper: str, root: Path) -> None:
    for i in range(50):
        start(helper, f"exec_{i:02d}", f"sleep 0.5; echo {i}", wait_ms=0)
    for i in range(50):
        view = until_ended(helper, f"exec_{i:02d}")
        assert (view.exit_code, view.stdout) == (0, f"{i}\n".encode())
