"""An exec's terminal (SPEC §16's PTYs): `rift_vm_exec` with `pty` starts an exec on
a terminal of its own in the guest (rift-pty, hypervisor/rift_pty.c); `resize`
gives that terminal a new size, as a terminal window that is resized does (the
program in it hears SIGWINCH). Its input is the exec's stdin (`send_input`), its
output the exec's stdout, its end the exec's: a terminal is an exec like any
other, recorded and listed as one."""

from __future__ import annotations

from rift.contract.execs import VmExecResizeIn
from rift.contract.views import ExecView
from rift.domain.errors import InvalidArgument
from rift.services.context import Caller, Deps
from rift.services.lifecycle.exec_ends import refresh
from rift.services.lifecycle.execs import held_exec
from rift.services.lifecycle.guest_kinds import reach
from rift.services.ports import ExecGone
from rift.services.read import views


def resize(deps: Deps, caller: Caller, cmd: VmExecResizeIn) -> ExecView:
    """A new size (`rows` x `cols`, bounded by the contract) for the terminal of a
    running exec of the handle's task started with `pty`."""
    _task, ex, vm = held_exec(deps, caller, cmd.handle, cmd.exec_id)
    if not ex.is_running or vm is None:
        raise InvalidArgument("exec_id", f"exec {ex.id} has ended ({ex.status}); its "
                              "terminal is gone")
    shell = reach(vm, deps.guests.execs)
    try:
        shell.exec_resize(vm, ex.id, cmd.rows, cmd.cols)
    except ExecGone as exc:
        current = refresh(deps, shell, vm, ex, caller.label)
        why = "has ended" if not current.is_running else "has no terminal (started without pty)"
        raise InvalidArgument("exec_id", f"exec {ex.id} {why}") from exc
    return views.execution(ex)


__all__ = ["resize"]
