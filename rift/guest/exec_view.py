"""What Rift says to `rift-exec`, the exec helper in a guest (its commands are
described in hypervisor/rift_exec.c), and what it answers: one view line, then
the stdout bytes, then the stderr bytes it names."""

from __future__ import annotations

import re
import shlex
from typing import Literal

from hypervisor.exec_helper import GUEST_PATH
from rift.services.ports import GuestExec

EXECS_DIR = "/run/rift-exec"  # each exec's folder in the guest: EXECS_DIR/<exec id>
_VIEW = re.compile(rb"rift-exec ((?:[a-z_]+=\S+ ?)+)\n")
_NUMBERS = ("code", "signal", "timed_out", "killed", "started", "ended", "out_total",
            "err_total", "out_from", "out_len", "err_from", "err_len")
NO_SUCH_EXEC, EXEC_ENDED, STDIN_CLOSED = 3, 4, 5  # the helper's exit statuses


class ViewError(ValueError):
    """The helper's answer is not a view (or not a whole one)."""


def exec_dir(exec_id: str) -> str:
    return f"{EXECS_DIR}/{exec_id}"


def start_command(exec_id: str, command: str, *, timeout_s: int, cap_bytes: int,
                  wait_ms: int, max_bytes: int, with_stdin: bool,
                  helper: str = GUEST_PATH) -> str:
    """The line that starts `command` as exec `exec_id` (run by the login shell)."""
    flags = " --stdin" if with_stdin else ""
    return (f"exec {helper} start {exec_dir(exec_id)} {timeout_s} {cap_bytes} {wait_ms} "
            f"{max_bytes}{flags} -- {shlex.quote(command)}")


def read_command(exec_id: str, stdout_offset: int, stderr_offset: int, max_bytes: int,
                 wait_ms: int, helper: str = GUEST_PATH) -> str:
    return (f"exec {helper} read {exec_dir(exec_id)} {stdout_offset} {stderr_offset} "
            f"{max_bytes} {wait_ms}")


def input_command(exec_id: str, *, eof: bool, helper: str = GUEST_PATH) -> str:
    return f"exec {helper} input {exec_dir(exec_id)}" + (" --eof" if eof else "")


def kill_command(exec_id: str, signal: Literal["TERM", "KILL"],
                 helper: str = GUEST_PATH) -> str:
    return f"exec {helper} kill {exec_dir(exec_id)} {signal}"


def parse_view(data: bytes) -> GuestExec:
    """The view at the start of `data` (ViewError when it is not a whole one)."""
    match = _VIEW.match(data)
    if match is None:
        raise ViewError(f"not a view: {data[:200]!r}")
    f = _fields(match.group(1))
    body = data[match.end():]
    if len(body) < f["out_len"] + f["err_len"]:
        raise ViewError("the view's output is cut short")
    state = match.group(1).split(b"state=")[1].split()[0].decode()
    if state not in ("running", "ended", "lost"):
        raise ViewError(f"unknown state {state!r}")
    return GuestExec(
        state=state,  # type: ignore[arg-type]
        exit_code=f["code"] if f["code"] >= 0 else None,
        signal=f["signal"] if f["signal"] >= 0 else None,
        timed_out=f["timed_out"] == 1, killed=f["killed"] == 1,
        stdin_open=b"stdin=open" in match.group(1),
        started_ms=f["started"], ended_ms=f["ended"] or None,
        stdout_total=f["out_total"], stderr_total=f["err_total"],
        stdout_from=f["out_from"], stderr_from=f["err_from"],
        stdout=body[:f["out_len"]], stderr=body[f["out_len"]:f["out_len"] + f["err_len"]])


def _fields(text: bytes) -> dict[str, int]:
    pairs = dict(part.split(b"=", 1) for part in text.split())
    try:
        return {name: int(pairs[name.encode()]) for name in _NUMBERS}
    except (KeyError, ValueError) as exc:
        raise ViewError(f"a view without {exc}") from exc
