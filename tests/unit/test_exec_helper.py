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


def test_a_clock_the_helper_cannot_read_is_a_usage_error_that_starts_nothing(
        helper: str, root: Path) -> None:
    """Exit 2 and no output is how Rift tells a helper older than `--clock` (which
    refuses the flag alike) and falls back to `date -s` (rift.guest.runner)."""
    for clock in ("--clock=", "--clock=soon", "--clock=-5", "--clock=12x"):
        proc = _shell(f"{helper} start {root}/exec_c 60 4096 1000 4096 {clock} "
                      f"-- 'touch {root.parent}/ran'")
        out, _ = proc.communicate(timeout=10)
        assert (proc.returncode, out) == (2, b""), clock
    assert not root.exists() and not (root.parent / "ran").exists()


def test_fifty_execs_at_once_each_end_with_their_own_output(helper: str, root: Path) -> None:
    for i in range(50):
        start(helper, f"exec_{i:02d}", f"sleep 0.5; echo {i}", wait_ms=0)
    for i in range(50):
        view = until_ended(helper, f"exec_{i:02d}")
        assert (view.exit_code, view.stdout) == (0, f"{i}\n".encode())


def _ended_folder(root: Path, name: str, ended_s_ago: float) -> None:
    """An ended exec's folder as the helper leaves it (its status, ended then)."""
    (root / name).mkdir(parents=True)
    for part in ("out", "err", "ctl", "stdin"):  # (no pid: the fixture kills its keeper)
        (root / name / part).write_bytes(b"")
    status = root / name / "status"
    status.write_text("0 -1 0 0 0\n")
    at = time.time() - ended_s_ago
    os.utime(status, (at, at))


def test_past_1024_ended_execs_the_oldest_ended_two_minutes_ago_go_and_nothing_else(
        helper: str, root: Path) -> None:
    """Each exec's folder would else stay until the VM ends (a guest ran out of
    inodes after some thousands): an exec's end looks them over, and past 1,024
    ended ones the oldest that ended 120 s ago or more go; a newer one, a running
    one (no status) and the 1,024 newest stay."""
    for i in range(1100):
        _ended_folder(root, f"exec_old{i:04d}", 3600 - i)  # the oldest first
    for i in range(5):
        _ended_folder(root, f"exec_new{i}", 10)  # ended just now: Rift may not know yet
    start(helper, "exec_running", "sleep 30", wait_ms=0)
    assert start(helper, "exec_last", "true").state == "ended"
    ended = 1100 + 5 + 1  # the old, the new and exec_last
    last_gone = root / f"exec_old{ended - 1024 - 1:04d}"
    deadline = time.monotonic() + 10
    while last_gone.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the keeper looks them over after its own status is written
    kept = {p.name for p in root.iterdir() if p.name.startswith("exec_")}
    gone = {f"exec_old{i:04d}" for i in range(ended - 1024)}
    assert not gone & kept, sorted(gone & kept)[:5]
    assert {f"exec_old{i:04d}" for i in range(ended - 1024, 1100)} <= kept
    assert {"exec_running", "exec_last", *(f"exec_new{i}" for i in range(5))} <= kept
    assert read(helper, "exec_running").state == "running"
    # looked over at most every 10 s: a second end right away removes nothing more
    _ended_folder(root, "exec_old_again", 3600)
    assert start(helper, "exec_after", "true").state == "ended"
    time.sleep(0.5)
    assert (root / "exec_old_again").exists()


def test_a_start_that_finds_no_room_removes_execs_ended_two_minutes_ago(
        helper: str, root: Path) -> None:
    """On a guest whose folder of execs is out of inodes, the next start removes the
    folders of execs ended 120 s ago or more (whatever their number) and starts; one
    ended since stays, and so does one with no status (running). (A tmpfs of 40
    inodes stands for the guest's /run.)"""
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "nr_inodes=40,size=4m", "tmpfs",
                              str(root)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {mounted.stderr!r}")
    try:
        made = 0
        with contextlib.suppress(OSError):  # until no inode is left
            while True:
                _ended_folder(root, f"exec_old{made:02d}", 600)
                made += 1
        assert made >= 3
        ended_now = f"exec_old{made - 1:02d}"
        os.utime(root / ended_now / "status")  # ended just now: Rift may not know yet
        assert start(helper, "exec_next", "echo room").stdout == b"room\n"
        left = {p.name for p in root.iterdir() if p.name.startswith("exec_old")}
        # the folder the filling ran out in has no status: running, to the helper
        assert left == {ended_now, f"exec_old{made:02d}"}, sorted(left)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
