"""An exec's end (SPEC §10), recorded once: a compare-and-set from `running`, with
its `exec_ended` event, by whichever call or sweep sees it first. What the guest
said is written here (its totals, then its end); an exec whose VM went, or that
its guest does not know, is `lost`. The sweep's part (`record_ends`) looks at the
running execs within each guest's budget; the VM's end (`end_for_vm`, from
`teardown.vm_ended`) loses its running execs.
"""

from __future__ import annotations

import signal as signals
from dataclasses import replace
from datetime import datetime, timedelta

from rift.contract.views import ExecView
from rift.domain.model import Exec, ExecEnd, ExecStatus, Vm
from rift.services.background.bounded import grouped, per_vm
from rift.services.context import Deps
from rift.services.lifecycle.leases import in_write
from rift.services.ports import ExecGone, ExecRead, GuestExec, GuestExecs, Tx
from rift.services.read import views

SWEEP_CALL_S = 3.0  # the sweep's look at one exec: a guest slower than this waits a run


def record_ends(deps: Deps, limit: int = 100) -> list[str]:
    """The sweep's part: end the running execs whose VM is gone (`lost`), whose
    guest says they ended, or that their guest has not known for
    `RIFT_VM_CREATING_GRACE_S` since their start (`lost`); one a call of this process
    waits on is that call's (`Deps.execs_in_flight`). Each run looks at
    `limit` execs from where the last left off (a rotating cursor), each VM's
    guest within its budget (rift.services.background.bounded). Answers the ids it ended."""
    with deps.store.read() as tx:
        running = tx.execs.running(limit, after=deps.cursors.execs)
        vms = {ex.vm_id: tx.vms.get(ex.vm_id) for ex in running}
    deps.cursors.execs = running[-1].id if len(running) == limit else None
    ended: list[str] = []
    asked: list[Exec] = []
    for ex in running:
        vm = vms.get(ex.vm_id)
        if vm is None or not vm.keeps_execs:
            if end_exec(deps, ex, "lost", "sweep").status == "lost":
                ended.append(ex.id)
        elif ex.id in deps.execs_in_flight:
            continue  # a call of this process waits on it, and records its end
        elif vm.status == "running" and vm.change is None and vm.ssh_port is not None:
            asked.append(ex)  # else paused, pausing or resuming: its execs wait in its guest
    guests, grace = deps.guests.execs, timedelta(seconds=deps.limits.creating_grace_s)

    def look(ex: Exec, left_s: float) -> str | None:
        vm = vms[ex.vm_id]
        assert vm is not None
        try:
            seen = guests.exec_read(vm, ExecRead(exec_id=ex.id, max_bytes=0,
                                                 deadline_s=min(SWEEP_CALL_S, left_s)))
        except ExecGone:
            # The row is written before the guest starts the command: a young exec the
            # guest does not know yet may be starting (its call ends it itself if the
            # start fails); an old one was lost (a reboot, or a crash before its start).
            if deps.clock.now() - ex.started_at >= grace:
                end_exec(deps, ex, "lost", "sweep")
                return ex.id
            return None
        if seen.state != "running" and record_seen(deps, ex, seen, "sweep").status != "running":
            return ex.id
        return None

    return ended + per_vm(grouped(asked, lambda ex: ex.vm_id), look)


def end_for_vm(tx: Tx, vm: Vm, now: datetime, actor: str) -> None:
    """The VM ended (rift.services.lifecycle.teardown.vm_ended): its running execs
    are lost."""
    for ex in tx.execs.of_task(vm.task_id, vm.id, running_only=True):
        _end_in(tx, ex, ExecEnd("lost", now), now, actor)


def out_of_sight(deps: Deps, ex: Exec, actor: str) -> ExecView:
    """A started exec its guest stopped answering about: lost if its VM went, else
    as last recorded (the guest may answer the next read)."""
    if vm_gone(deps, ex.vm_id):
        return views.execution(end_exec(deps, ex, "lost", actor))
    with deps.store.read() as tx:
        return views.execution(tx.execs.get(ex.id) or ex)


def vm_gone(deps: Deps, vm_id: str) -> bool:
    """Gone, or going (its destroy is recorded before libvirt is asked); a paused
    VM keeps its execs in its saved state."""
    with deps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    return vm is None or not vm.keeps_execs


def record_seen(deps: Deps, ex: Exec, seen: GuestExec, actor: str) -> Exec:
    """Write what the guest said: the totals, and the end once."""
    if seen.state == "running":
        if (seen.stdout_total, seen.stderr_total) != (ex.stdout_bytes, ex.stderr_bytes):
            with deps.store.write() as tx:
                tx.execs.seen(ex.id, seen.stdout_total, seen.stderr_total)
        return replace(ex, stdout_bytes=max(ex.stdout_bytes, seen.stdout_total),
                       stderr_bytes=max(ex.stderr_bytes, seen.stderr_total))
    status: ExecStatus = ("lost" if seen.state == "lost" else "timed_out" if seen.timed_out
                          else "killed" if seen.killed else "exited")
    totals = (seen.stdout_total, seen.stderr_total)
    if seen.state == "ended":
        duration = max(0, (seen.ended_ms or seen.started_ms) - seen.started_ms)
        end = ExecEnd(status, ex.started_at + timedelta(milliseconds=duration),
                      exit_code=seen.exit_code, signal=signal_name(seen.signal),
                      duration_ms=duration, timed_out=seen.timed_out, totals=totals)
    else:
        end = ExecEnd(status, deps.clock.now(), timed_out=seen.timed_out, totals=totals)
    return _end_with(deps, ex, end, actor)


def end_exec(deps: Deps, ex: Exec, status: ExecStatus, actor: str) -> Exec:
    return _end_with(deps, ex, ExecEnd(status, deps.clock.now()), actor)


def _end_with(deps: Deps, ex: Exec, end: ExecEnd, actor: str) -> Exec:
    def work(tx: Tx) -> Exec:
        current = tx.execs.get(ex.id)
        if current is None or not current.is_running:
            return current or ex  # ended meanwhile by another call or the sweep
        return _end_in(tx, current, end, deps.clock.now(), actor)

    return in_write(deps.store, work)


def _end_in(tx: Tx, ex: Exec, end: ExecEnd, now: datetime, actor: str) -> Exec:
    """`ex` (running, as read in `tx`) ended as `end` says, with its event; as it is
    when another caller ended it first."""
    ended, event = ex.ended(end, actor, now)
    if not tx.execs.save(ended, ex):
        return tx.execs.get(ex.id) or ex
    tx.events.add(event)
    return ended


def refresh(deps: Deps, shell: GuestExecs, vm: Vm, ex: Exec, actor: str) -> Exec:
    try:
        seen = shell.exec_read(vm, ExecRead(exec_id=ex.id, max_bytes=0))
    except ExecGone:
        return end_exec(deps, ex, "lost", actor)
    return record_seen(deps, ex, seen, actor)


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signals.Signals(number).name.removeprefix("SIG")
    except ValueError:
        return str(number)
