"""A guest's commands over SSH: one run to its end on its channel (`exec`), and
background execs kept by rift-exec in the guest (hypervisor/rift_exec.c), whose
views are read up to a limit (SPEC §15)."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, replace
from typing import Literal

from hypervisor import pty_helper
from rift.domain.model import Vm
from rift.guest.errors import GuestError, GuestExecError
from rift.guest.exec_view import (
    EXEC_ENDED,
    NO_SUCH_EXEC,
    STDIN_CLOSED,
    ViewError,
    exec_dir,
    input_command,
    kill_command,
    parse_view,
    read_command,
    start_command,
    view_size,
)
from rift.guest.runner import HelperCall, Runner
from rift.services.ports import ExecRead, ExecStart, GuestExec

_SMALL_ANSWER = 4096  # the most a helper's `input` or `kill` prints
NO_PTY_HELPER = 97  # a terminal's start line's status in a guest without rift-pty


@dataclass(frozen=True)
class ExecResult:
    """A command run to its end on one channel (`ShellExecs.exec`)."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration_ms: int


class ShellExecs:
    """Commands in the guest: to their end, or detached under rift-exec."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    @property
    def slack_s(self) -> float:
        """How long past its own wait a helper call may take (its channel and
        process): RIFT_HELPER_SLACK_S."""
        return self.runner.conns.settings.helper_slack_s

    def exec(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: int) -> ExecResult:
        started = time.monotonic()
        collected = self.runner.run(vm, self.runner.environment(vm) + command, stdin,
                                    float(timeout_s), self.runner.conns.settings.output_cap)
        return ExecResult(
            exit_code=collected.exit_code,
            stdout=collected.stdout,
            stderr=collected.stderr,
            timed_out=collected.timed_out,
            truncated=collected.truncated,
            duration_ms=round((time.monotonic() - started) * 1000),
        )

    # background execs (rift-exec in the guest: hypervisor/rift_exec.c)

    def exec_start(self, vm: Vm, start: ExecStart) -> GuestExec:
        """Start `start.command` detached in the guest as exec `start.exec_id` and
        answer its view once it ended or `wait_ms` passed (it runs on after).
        `stdin`, when given, is its whole stdin; else its stdin stays open for
        `exec_input`. With `start.pty`, rift-pty (hypervisor/rift_pty.c) runs it on
        a terminal, put into the guest first when the guest has none."""
        command = self.runner.environment(vm) + start.command
        line = ""
        if start.pty is not None:
            rows, cols = start.pty
            command = pty_helper.run_command_line(rows, cols, _tty_file(start.exec_id),
                                                  shlex.quote(command))
            line = f"[ -x {pty_helper.GUEST_PATH} ] || exit {NO_PTY_HELPER}; "
        wrapped = replace(start, command=command)
        call = HelperCall(
            line=line + start_command(wrapped), stdin=start.stdin,
            clocked=lambda cs: line + start_command(wrapped, clock_cs=cs),
            timeout_s=start.wait_ms / 1000 + self.slack_s, view=True,
            limit=view_size(start.max_bytes), also=(NO_PTY_HELPER,))
        status, data = self.runner.helper(vm, call)
        if status == NO_PTY_HELPER:
            self._put_pty_helper(vm)
            status, data = self.runner.helper(vm, call)
        return self._view(vm, start.exec_id, status, data, start.max_bytes)

    def exec_resize(self, vm: Vm, exec_id: str, rows: int, cols: int) -> None:
        """Give the terminal of exec `exec_id` (started with `pty`) a new size.
        GuestExecError (`ended`) when it has no terminal. A terminal just started
        may not have written its name yet: its folder is looked at for up to 2 s."""
        tty = _tty_file(exec_id)
        line = (f"[ -x {pty_helper.GUEST_PATH} ] || exit {NO_SUCH_EXEC}; i=0; "
                f"while [ ! -s {tty} ] && [ $i -lt 200 ]; do sleep 0.01; i=$((i+1)); done; "
                + pty_helper.resize_command_line(tty, rows, cols))
        status, out = self.runner.helper(vm, HelperCall(
            line=line, timeout_s=self.slack_s, view=False, limit=_SMALL_ANSWER))
        if status == NO_SUCH_EXEC:
            raise GuestExecError(exec_id, "ended", vm_id=vm.id)
        if status != 0:
            raise GuestError(f"rift-pty resize failed (exit {status}): {out[-200:]!r}",
                             vm_id=vm.id)

    def _put_pty_helper(self, vm: Vm) -> None:
        found = self.runner.helper_binary
        if found is None:
            raise GuestError("the guest has no rift-pty and none is at hand", vm_id=vm.id)
        self.runner.put_binary(vm, lambda: pty_helper.pty_helper(found().parent),
                               pty_helper.GUEST_PATH)

    def exec_read(self, vm: Vm, read: ExecRead) -> GuestExec:
        """The exec's view with output from the offsets, once there is some past
        them, it ended, or `wait_ms` passed; GuestError past `deadline_s` (default:
        the wait and the helper's slack)."""
        line = read_command(read)
        deadline_s = (read.wait_ms / 1000 + self.slack_s if read.deadline_s is None
                      else read.deadline_s)
        status, data = self.runner.helper(vm, HelperCall(
            line=line, timeout_s=deadline_s, view=True, limit=view_size(read.max_bytes)))
        return self._view(vm, read.exec_id, status, data, read.max_bytes)

    def exec_input(self, vm: Vm, exec_id: str, data: bytes, *, eof: bool) -> int:
        """Write `data` to the exec's stdin (then close it, with `eof`); answers the
        bytes written. GuestExecError when it ended or its stdin is closed."""
        status, out = self.runner.helper(vm, HelperCall(
            line=input_command(exec_id, eof=eof), stdin=data,
            timeout_s=self.runner.conns.settings.file_timeout_s, view=False,
            limit=_SMALL_ANSWER))
        if status in (NO_SUCH_EXEC, EXEC_ENDED):
            raise GuestExecError(exec_id, "ended", vm_id=vm.id)
        if status == STDIN_CLOSED:
            raise GuestExecError(exec_id, "stdin_closed", vm_id=vm.id)
        if status != 0:
            raise GuestError(f"rift-exec input failed (exit {status}): {out[-200:]!r}",
                             vm_id=vm.id)
        return len(data)

    def exec_kill(self, vm: Vm, exec_id: str, signal: Literal["TERM", "KILL"]) -> None:
        """Signal the exec's process group (TERM: KILL follows 5 s later in the guest).
        An exec that ended already is left as it is."""
        status, out = self.runner.helper(vm, HelperCall(
            line=kill_command(exec_id, signal), timeout_s=self.slack_s, view=False,
            limit=_SMALL_ANSWER))
        if status not in (0, NO_SUCH_EXEC):
            raise GuestError(f"rift-exec kill failed (exit {status}): {out[-200:]!r}",
                             vm_id=vm.id)

    def _view(self, vm: Vm, exec_id: str, status: int | None, data: bytes,
              max_bytes: int) -> GuestExec:
        if status == NO_SUCH_EXEC:
            raise GuestExecError(exec_id, "unknown", vm_id=vm.id)
        try:
            return parse_view(data, max_bytes)
        except ViewError as exc:
            raise GuestError(f"rift-exec answered no view (exit {status}): {exc}",
                             vm_id=vm.id) from exc


def _tty_file(exec_id: str) -> str:
    """Where rift-pty writes the name of exec `exec_id`'s terminal."""
    return exec_dir(exec_id) + "/tty"
