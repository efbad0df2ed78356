"""Execs (SPEC §10): commands that run detached in a VM's guest and outlive the
call that started them. `rift_vm_exec` records the exec (`running`, with its
`exec_started` event) before the guest starts it, so no command runs without a
row; its end is recorded once, by whichever call or sweep sees it first
(`exec_ends.py`). The output stays in the guest (rift-exec's rings); Rift keeps
only the totals it last saw.

While a call waits on a guest (an exec's end, a long poll), its task's activity
clock keeps moving at its step (leases.in_flight): no lease turns quiet under a
call that is still working.
"""

from __future__ import annotations

import time

from rift.contract.base import MAX_OFFSET, decoded
from rift.contract.execs import (
    ExecInputOut,
    ExecListOut,
    VmExecGetIn,
    VmExecIn,
    VmExecInputIn,
    VmExecKillIn,
    VmExecListIn,
)
from rift.contract.views import ExecView
from rift.domain.errors import (
    ExecNotFound,
    GuestUnreachable,
    InvalidArgument,
    VmAsleep,
    VmNotRunning,
)
from rift.domain.ids import new_exec_id
from rift.domain.model import Exec, NewEvent, Task, Vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle.exec_ends import end_exec, out_of_sight, record_seen, refresh, vm_gone
from rift.services.lifecycle.guest_kinds import reach
from rift.services.lifecycle.leases import (
    check_handle,
    check_rate,
    in_flight,
    in_write,
    parse_handle,
    task_vm,
)
from rift.services.lifecycle.sleeps import awake
from rift.services.ports import ExecGone, ExecRead, ExecStart, GuestExec, GuestExecs, Tx
from rift.services.ports.watch import STEP_S, Watch, newest_line
from rift.services.read import views
from rift.services.read.views import Output

MIB = 1 << 20
ANSWER_BYTES = MIB  # the most of each stream one answer carries


# -- starting ---------------------------------------------------------------------------

def start(deps: Deps, caller: Caller, cmd: VmExecIn, watch: Watch | None = None) -> ExecView:
    """`rift_vm_exec`: record the exec, start it in the guest, and answer its view at
    its end or after `wait_s` (RIFT_EXEC_WAIT_S by default). A `watch` hears of the
    exec and its newest output line while the call waits, and can stop the wait."""
    command, stdin, timeout, vm_id = cmd.command, cmd.stdin, cmd.timeout_s, cmd.vm_id
    wait = deps.limits.exec_wait_s if cmd.wait_s is None else cmd.wait_s
    parsed = parse_handle(cmd.handle)
    exec_id = new_exec_id()

    def record(tx: Tx) -> tuple[Task, Vm, Exec]:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        vm = task_vm(tx, task, vm_id)
        check_rate(tx, ("execs", caller.user), "exec starts", deps.limits.rate_exec_new_per_h,
                   now)
        reach(vm, deps.guests.execs)  # guest_unreachable before anything is recorded
        ex = Exec(id=exec_id, task_id=task.id, vm_id=vm.id, owner=caller.user,
                  command=command, status="running", timeout_s=timeout, started_at=now)
        tx.execs.add(ex)
        tx.events.add(NewEvent(task.id, "exec_started", now, caller.label,
                               {"exec_id": exec_id, "vm_id": vm.id}))
        return task, vm, ex

    task, vm, ex = awake(deps, caller.label, lambda: in_write(deps.store, record),  # SPEC §17
                         woken_by="exec")
    if watch is not None:
        watch.begun(exec_id)
    shell = reach(vm, deps.guests.execs)
    deadline = time.monotonic() + wait
    first = wait if watch is None else min(wait, STEP_S)
    try:
        with in_flight(deps, task.id, wait), deps.execs_in_flight.waiting_on(exec_id):
            seen = shell.exec_start(vm, ExecStart(
                exec_id=exec_id, command=command,
                stdin=stdin.encode() if stdin is not None else None, timeout_s=timeout,
                cap_bytes=deps.limits.exec_output_mib * MIB, wait_ms=int(first * 1000),
                max_bytes=ANSWER_BYTES, pty=(cmd.pty.rows, cmd.pty.cols) if cmd.pty else None))
    except (GuestUnreachable, ExecGone) as exc:
        lost = end_exec(deps, ex, "lost", caller.label)
        if vm_gone(deps, vm.id):  # destroyed while the call waited: the exec is lost
            return views.execution(lost)
        if isinstance(exc, GuestUnreachable):
            raise
        raise GuestUnreachable(vm.id, "the guest lost the exec as it started") from exc
    if watch is not None and seen.state == "running" and wait > first:
        try:
            with in_flight(deps, task.id, wait), deps.execs_in_flight.waiting_on(exec_id):
                seen = _follow_to_end(shell, (vm, ex.id), seen, deadline, watch)
        except (GuestUnreachable, ExecGone):
            return out_of_sight(deps, ex, caller.label)
    return _answer(deps, ex, seen, (0, 0), caller.label)


# -- reading, input, kill, list ------------------------------------------------------------

def get(deps: Deps, caller: Caller, cmd: VmExecGetIn, watch: Watch | None = None) -> ExecView:
    """`rift_vm_exec_get`: the exec's view with output from the offsets, waiting up to
    `wait_s` for output past them or its end (in steps when a `watch` can stop it)."""
    out_from, err_from, wait = cmd.stdout_offset, cmd.stderr_offset, cmd.wait_s
    task, ex, vm = held_exec(deps, caller, cmd.handle, cmd.exec_id)
    _check_offsets(ex, out_from, err_from)
    if not ex.is_running and vm is None:
        return views.execution(ex, Output(stdout_offset=out_from, stderr_offset=err_from))
    if vm is None:
        return views.execution(end_exec(deps, ex, "lost", caller.label))
    if watch is not None:
        watch.begun(ex.id)
    shell = reach(vm, deps.guests.execs)
    deadline = time.monotonic() + wait
    try:
        with in_flight(deps, task.id, wait), deps.execs_in_flight.waiting_on(ex.id):
            left: float = wait
            while True:
                step = left if watch is None else min(left, STEP_S)
                seen = shell.exec_read(vm, ExecRead(
                    exec_id=ex.id, stdout_offset=out_from, stderr_offset=err_from,
                    max_bytes=ANSWER_BYTES, wait_ms=max(0, int(step * 1000))))
                news = (seen.state != "running" or seen.stdout_total > out_from
                        or seen.stderr_total > err_from)
                left = deadline - time.monotonic()
                if news or watch is None or watch.stopped or left <= 0:
                    break
    except ExecGone:
        return views.execution(end_exec(deps, ex, "lost", caller.label) if ex.is_running else ex)
    if out_from > seen.stdout_total or err_from > seen.stderr_total:
        field = "stdout_offset" if out_from > seen.stdout_total else "stderr_offset"
        total = seen.stdout_total if field == "stdout_offset" else seen.stderr_total
        raise InvalidArgument(field, f"beyond the {total} bytes the exec wrote so far")
    return _answer(deps, ex, seen, (out_from, err_from), caller.label)


def send_input(deps: Deps, caller: Caller, cmd: VmExecInputIn) -> ExecInputOut:
    """`rift_vm_exec_input`: write to a running exec's stdin; `eof` closes it."""
    raw = decoded("data", cmd.data, cmd.encoding)
    exec_id, eof = cmd.exec_id, cmd.eof
    _task, ex, vm = held_exec(deps, caller, cmd.handle, exec_id)
    if not ex.is_running or vm is None:
        raise InvalidArgument("exec_id", f"exec {exec_id} has ended ({ex.status}); its stdin "
                              "takes no more input")
    shell = reach(vm, deps.guests.execs)
    try:
        written = shell.exec_input(vm, ex.id, raw, eof=eof)
    except ExecGone as exc:
        if exc.why == "stdin_closed":
            raise InvalidArgument("eof", f"the stdin of exec {exec_id} is closed already "
                                  "(eof was sent, or the command closed it)") from exc
        refresh(deps, shell, vm, ex, caller.label)
        raise InvalidArgument("exec_id", f"exec {exec_id} has ended; its stdin takes no "
                              "more input") from exc
    return ExecInputOut(exec_id=ex.id, bytes=written)


def kill(deps: Deps, caller: Caller, cmd: VmExecKillIn) -> ExecView:
    """`rift_vm_exec_kill`: signal a running exec's process group (a repeat changes
    nothing)."""
    _task, ex, vm = held_exec(deps, caller, cmd.handle, cmd.exec_id)
    if not ex.is_running:
        return views.execution(ex)
    if vm is None:
        return views.execution(end_exec(deps, ex, "lost", caller.label))
    shell = reach(vm, deps.guests.execs)
    try:
        shell.exec_kill(vm, ex.id, cmd.signal)
    except ExecGone:
        return views.execution(end_exec(deps, ex, "lost", caller.label))
    return views.execution(refresh(deps, shell, vm, ex, caller.label))


def list_execs(deps: Deps, caller: Caller, cmd: VmExecListIn) -> ExecListOut:
    """`rift_vm_exec_list`: the handle's task's execs (of one VM): running ones, or all."""
    which, vm_id = cmd.status, cmd.vm_id
    parsed = parse_handle(cmd.handle)

    def work(tx: Tx) -> list[Exec]:
        task = check_handle(deps, tx, caller, parsed, deps.clock.now())
        if vm_id is not None:
            task_vm(tx, task, vm_id, running=False)
        return tx.execs.of_task(task.id, vm_id, running_only=which == "running")

    return ExecListOut(execs=[views.execution(ex) for ex in in_write(deps.store, work)])


def _follow_to_end(shell: GuestExecs, at: tuple[Vm, str], seen: GuestExec,
                   deadline: float, watch: Watch) -> GuestExec:
    """Wait for the exec (`at`: its VM and id) to end in steps, noting its newest
    output line before each, until `deadline` or a stop; answer its view with
    output from the start."""
    vm, exec_id = at
    tail = 4096
    while seen.state == "running" and not watch.stopped:
        seen = shell.exec_read(vm, ExecRead(
            exec_id=exec_id, stdout_offset=max(0, seen.stdout_total - tail),
            stderr_offset=max(0, seen.stderr_total - tail), max_bytes=tail))
        watch.note(newest_line(seen.stdout) or newest_line(seen.stderr))
        left = deadline - time.monotonic()
        if left <= 0 or seen.state != "running":
            break
        # Offsets past any output: the guest answers at the end, or when the step is up.
        seen = shell.exec_read(vm, ExecRead(
            exec_id=exec_id, stdout_offset=MAX_OFFSET, stderr_offset=MAX_OFFSET, max_bytes=0,
            wait_ms=int(min(left, STEP_S) * 1000)))
    return shell.exec_read(vm, ExecRead(exec_id=exec_id, max_bytes=ANSWER_BYTES))


def _answer(deps: Deps, ex: Exec, seen: GuestExec, offsets: tuple[int, int],
            actor: str) -> ExecView:
    """Record what the guest said and answer the exec's view with the output read
    from `offsets` (stdout's, stderr's)."""
    out_from, err_from = offsets
    current = record_seen(deps, ex, seen, actor)
    truncated = seen.stdout_from > out_from or seen.stderr_from > err_from
    duration = current.duration_ms
    if duration is None:
        duration = max(0, int((deps.clock.now() - ex.started_at).total_seconds() * 1000))
    return views.execution(current, Output(
        seen.stdout, seen.stderr, seen.stdout_from + len(seen.stdout),
        seen.stderr_from + len(seen.stderr), truncated, duration))


# -- helpers ------------------------------------------------------------------------------

def held_exec(deps: Deps, caller: Caller, handle: str | None,
               exec_id: str) -> tuple[Task, Exec, Vm | None]:
    """The handle's task, the exec of it, and its VM while that runs. A running exec
    of a paused VM is refused (`vm_not_running`, naming rift_vm_resume): it waits
    in the saved state, out of reach."""
    parsed = parse_handle(handle)

    def work(tx: Tx) -> tuple[Task, Exec, Vm | None]:
        task = check_handle(deps, tx, caller, parsed, deps.clock.now())
        ex = tx.execs.get(exec_id)
        if ex is None or ex.task_id != task.id:
            raise ExecNotFound(exec_id)
        vm = tx.vms.get(ex.vm_id)
        if ex.is_running and vm is not None and vm.status == "paused":
            raise VmNotRunning(vm.id, vm.status)  # its exec waits in the saved state
        if ex.is_running and vm is not None and (
                vm.status == "sleeping" or vm.change in ("falling_asleep", "waking")):
            raise VmAsleep(vm.id, vm.status, doing=vm.change)  # woken (SPEC §17)
        return task, ex, vm if vm is not None and vm.status == "running" else None

    return awake(deps, caller.label, lambda: in_write(deps.store, work), woken_by="exec")


def _check_offsets(ex: Exec, out_from: int, err_from: int) -> None:
    """Offsets past all an ended exec wrote are refused at once (a running one's
    totals are the guest's to say)."""
    if ex.is_running:
        return
    for field, offset, total in (("stdout_offset", out_from, ex.stdout_bytes),
                                 ("stderr_offset", err_from, ex.stderr_bytes)):
        if offset > total:
            raise InvalidArgument(field, f"beyond the {total} bytes the exec wrote")


__all__ = ["get", "kill", "list_execs", "send_input", "start"]
