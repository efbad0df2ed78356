"""What Rift says to `rift-exec`, the exec helper in a guest (its commands are
described in hypervisor/rift_exec.c), and what it answers: one view line, then
the stdout bytes, then the stderr bytes it names."""

from __future__ import annotations

import shlex
from typing import Literal

from hypervisor.exec_helper import GUEST_PATH
from rift.services.ports import ExecRead, ExecStart, GuestExec

EXECS_DIR = "/run/rift-exec"  # each exec's folder in the guest: EXECS_DIR/<exec id>
PREFIX = b"rift-exec "
VIEW_LINE_MAX = 1024  # the longest view line Rift reads (the helper's is under 300 bytes)
# Each number of the view and the values it may take (a guest may print anything).
_RANGES: dict[str, tuple[int, int]] = {
    "code": (-1, 255), "signal": (-1, 255), "timed_out": (0, 1), "killed": (0, 1),
    "started": (0, 2**63 - 1), "ended": (0, 2**63 - 1),
    "out_total": (0, 2**63 - 1), "err_total": (0, 2**63 - 1),
    "out_from": (0, 2**63 - 1), "err_from": (0, 2**63 - 1),
    "out_len": (0, 2**63 - 1), "err_len": (0, 2**63 - 1),
}
_WORDS = {"state": (b"running", b"ended", b"lost"), "stdin": (b"open", b"closed")}
NO_SUCH_EXEC, EXEC_ENDED, STDIN_CLOSED = 3, 4, 5  # the helper's exit statuses


class ViewError(ValueError):
    """The helper's answer is not a view (or not a whole one)."""


def exec_dir(exec_id: str) -> str:
    return f"{EXECS_DIR}/{exec_id}"


def start_command(start: ExecStart, helper: str = GUEST_PATH, clock_cs: int | None = None) -> str:
    """The line that starts `start.command` as exec `start.exec_id` (run by the login
    shell), reading its stdin from the channel when it has one; with `clock_cs`, the
    helper sets the guest's clock to it first (hundredths of a second since the epoch)."""
    flags = f" --clock={clock_cs}" if clock_cs is not None else ""
    flags += " --stdin" if start.stdin is not None else ""
    return (f"exec {helper} start {exec_dir(start.exec_id)} {start.timeout_s} "
            f"{start.cap_bytes} {start.wait_ms} {start.max_bytes}{flags} -- "
            f"{shlex.quote(start.command)}")


def read_command(read: ExecRead, helper: str = GUEST_PATH) -> str:
    return (f"exec {helper} read {exec_dir(read.exec_id)} {read.stdout_offset} "
            f"{read.stderr_offset} {read.max_bytes} {read.wait_ms}")


def input_command(exec_id: str, *, eof: bool, helper: str = GUEST_PATH) -> str:
    return f"exec {helper} input {exec_dir(exec_id)}" + (" --eof" if eof else "")


def kill_command(exec_id: str, signal: Literal["TERM", "KILL"],
                 helper: str = GUEST_PATH) -> str:
    return f"exec {helper} kill {exec_dir(exec_id)} {signal}"


def view_size(max_bytes: int) -> int:
    """The most a view answered to a call asking `max_bytes` per stream may hold."""
    return len(PREFIX) + VIEW_LINE_MAX + 2 * max_bytes


def parse_view(data: bytes, max_bytes: int) -> GuestExec:
    """The view that is the whole of `data`, for a call that asked for at most
    `max_bytes` of each stream (ViewError when it is not exactly one).

    What a guest prints is hostile (SPEC §15): the line is looked for only in its
    first VIEW_LINE_MAX bytes, split on spaces (no pattern, nothing backtracks),
    every field must be known, present once and within its range, and the bytes
    after the line must be exactly the `out_len` + `err_len` it announced."""
    if not data.startswith(PREFIX):
        raise ViewError(f"not a view: {data[:80]!r}")
    end = data.find(b"\n", len(PREFIX), len(PREFIX) + VIEW_LINE_MAX)
    if end < 0:
        raise ViewError(f"no view line within {VIEW_LINE_MAX} bytes")
    numbers, words = _fields(data[len(PREFIX):end])
    out_len, err_len = numbers["out_len"], numbers["err_len"]
    if out_len > max_bytes or err_len > max_bytes:
        raise ViewError(f"the view announces more output ({out_len}+{err_len} bytes) "
                        f"than the {max_bytes} asked for")
    body = memoryview(data)[end + 1:]
    if len(body) != out_len + err_len:
        raise ViewError(f"the view announces {out_len + err_len} bytes of output and "
                        f"{len(body)} follow")
    return GuestExec(
        state=words["state"].decode(),  # type: ignore[arg-type]
        exit_code=numbers["code"] if numbers["code"] >= 0 else None,
        signal=numbers["signal"] if numbers["signal"] >= 0 else None,
        timed_out=numbers["timed_out"] == 1, killed=numbers["killed"] == 1,
        stdin_open=words["stdin"] == b"open",
        started_ms=numbers["started"], ended_ms=numbers["ended"] or None,
        stdout_total=numbers["out_total"], stderr_total=numbers["err_total"],
        stdout_from=numbers["out_from"], stderr_from=numbers["err_from"],
        stdout=bytes(body[:out_len]), stderr=bytes(body[out_len:]))


def _fields(line: bytes) -> tuple[dict[str, int], dict[str, bytes]]:
    """The view line's numbers and words; ViewError unless each known field is
    there once, with a value in its range, and nothing else is."""
    numbers: dict[str, int] = {}
    words: dict[str, bytes] = {}
    for part in line.split(b" "):
        if not part:
            continue  # the line's trailing space, or two spaces
        key, eq, value = part.partition(b"=")
        name = key.decode("ascii", "replace")
        if not eq or name in numbers or name in words:
            raise ViewError(f"a view with a bad or repeated field {part[:40]!r}")
        if name in _WORDS:
            if value not in _WORDS[name]:
                raise ViewError(f"a view with {name}={value[:40]!r}")
            words[name] = value
            continue
        bounds = _RANGES.get(name)
        if bounds is None:
            raise ViewError(f"a view with an unknown field {key[:40]!r}")
        digits = value[1:] if value.startswith(b"-") else value
        if not digits.isdigit() or len(digits) > 19:
            raise ViewError(f"a view with {name}={value[:40]!r}")
        number = int(value)
        if not bounds[0] <= number <= bounds[1]:
            raise ViewError(f"a view with {name}={number} out of range")
        numbers[name] = number
    missing = [name for name in (*_RANGES, *_WORDS) if name not in numbers and name not in words]
    if missing:
        raise ViewError(f"a view without {', '.join(missing)}")
    return numbers, words
