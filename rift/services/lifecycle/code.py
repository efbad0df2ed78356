"""Code contexts (SPEC §20): code run in a kernel that keeps its state, in a VM's
guest, by rift-code (hypervisor/rift_code.py) through the `GuestCode` port. The
contexts and their runs live in the guest (its server's memory, so a pause, a sleep
or a fork keeps them and a reboot ends them); Rift keeps a row of each
(rift.services.lifecycle.code_records: its language, its last run, a run in flight)
for the VM's view, the Boxes page and the sleep sweep, gone with the VM.

A run behaves as an exec (SPEC §10): it goes on in the guest past the call, the
call waits for its end at most `wait_s` (in steps of STEP_S under a `Watch`, which
hears the newest output line), its task's activity clock moves while it waits, and
a stop (an MCP cancel) interrupts the kernel (`interrupt`): the context goes on.
"""

from __future__ import annotations

import time
from typing import Any

from rift.contract.code import (
    ContextListOut,
    ContextOut,
    ExecutionView,
    RunCodeOut,
    VmCodeContextIn,
    VmCodeContextListIn,
    VmCodeContextNewIn,
    VmRunCodeGetIn,
    VmRunCodeIn,
)
from rift.domain.code_contexts import RunStart
from rift.domain.errors import ContextNotFound, GuestUnreachable, InvalidArgument
from rift.domain.ids import new_context_id, new_run_id
from rift.domain.model import Task, Vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle import code_records
from rift.services.lifecycle.guest_kinds import reach
from rift.services.lifecycle.leases import (
    check_handle,
    check_running,
    in_flight,
    in_write,
    parse_handle,
    task_vm,
)
from rift.services.lifecycle.sleeps import awake
from rift.services.ports import Tx
from rift.services.ports.code import CodeRequest, GuestCode, NoPython
from rift.services.ports.watch import STEP_S, Watch
from rift.services.read import code_views

SLACK_S = 60.0  # past a request's own wait: the server's start, a kernel's, the channel
KERNEL_START_S = 300.0  # a new context's kernel (ipykernel under TCG: tens of seconds)
WARM_S = 120.0  # a pooled VM's wait for its default kernel (ipykernel under TCG: 15-25 s)
DEFAULT = "default"
RUNS_KEPT = 64  # the runs the guest's server keeps (hypervisor/rift_code.py)


def run(deps: Deps, caller: Caller, cmd: VmRunCodeIn, watch: Watch | None = None) -> RunCodeOut:
    """`rift_vm_run_code`: run `cmd.code` in the context (the VM's default one unless
    named) and answer its execution at its end or after `wait_s`."""
    context_id = cmd.context_id or DEFAULT
    run_id = new_run_id()
    task, vm, port = guest_vm(deps, caller, cmd.handle, cmd.vm_id,
                               RunStart(context_id, run_id, cmd.timeout_s))
    wait = deps.limits.exec_wait_s if cmd.wait_s is None else cmd.wait_s
    if watch is not None:
        watch.begun(f"{vm.id}/{context_id}/{run_id}")
    deadline = time.monotonic() + wait
    step = wait if watch is None else 0 if watch.stopped else min(wait, STEP_S)
    with in_flight(deps, task.id, wait):
        try:
            answer = ask(port, vm, req("POST", "/runs", step, {
                "run_id": run_id, "context_id": context_id, "code": cmd.code,
                "timeout_s": cmd.timeout_s, "wait_ms": int(step * 1000),
                "env": cmd.env or {}}), context_id)
        except (ContextNotFound, InvalidArgument):  # the guest did not take it
            code_records.run_refused(deps, vm, context_id, run_id)
            raise
        view = _followed(port, vm, answer, deadline, watch)
    code_records.run_seen(deps, vm, view, cmd.timeout_s)
    return RunCodeOut(execution=view)


def get_run(deps: Deps, caller: Caller, cmd: VmRunCodeGetIn,
            watch: Watch | None = None) -> RunCodeOut:
    """`rift_vm_run_code_get`: a run's execution as the guest has it now, waiting up to
    `wait_s` for its end (in steps under a `watch`)."""
    task, vm, port = guest_vm(deps, caller, cmd.handle, cmd.vm_id)
    deadline = time.monotonic() + cmd.wait_s
    step = cmd.wait_s if watch is None else min(cmd.wait_s, STEP_S)
    with in_flight(deps, task.id, cmd.wait_s):
        answer = ask(port, vm, req("GET", f"/runs/{cmd.run_id}?wait_ms={int(step * 1000)}",
                                     step), DEFAULT)
        if watch is not None and isinstance(answer, dict):
            watch.begun(f"{vm.id}/{answer.get('context_id')}/{cmd.run_id}")
        view = _followed(port, vm, answer, deadline, watch)
    code_records.run_seen(deps, vm, view)
    return RunCodeOut(execution=view)


def _followed(port: GuestCode, vm: Vm, answer: Any, deadline: float,
              watch: Watch | None) -> ExecutionView:
    """The run's view once it ended, `deadline` passed, or its watch stopped, read in
    steps of STEP_S (its newest line noted before each) under a watch."""
    view, newest = code_views.execution(vm.id, answer)
    while view.status == "running" and watch is not None and not watch.stopped:
        watch.note(newest)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        step = min(left, STEP_S)
        answer = ask(port, vm, req("GET", f"/runs/{view.run_id}?wait_ms={int(step * 1000)}",
                                     step), view.context_id)
        view, newest = code_views.execution(vm.id, answer)
    if view.status == "running" and watch is not None and watch.stopped:
        # stopped before the guest had the run (a cancel racing its start): this run
        # is interrupted here too; the context's next runs are not
        ask(port, vm, req("POST", f"/contexts/{view.context_id}/interrupt", 0,
                          {"run_id": view.run_id}), view.context_id)
    return view


def interrupt(deps: Deps, caller: Caller, handle: str | None, target: str) -> None:
    """Interrupt a run (`target`: `<vm id>/<context id>/<run id>`, what `run` told its
    watch; without the run id, every run of the context not ended): a cancelled
    `rift_vm_run_code`. The context goes on."""
    vm_id, _, rest = target.partition("/")
    context_id, _, run_id = rest.partition("/")
    _task, vm, port = guest_vm(deps, caller, handle, vm_id)
    ask(port, vm, req("POST", f"/contexts/{context_id}/interrupt", 0,
                      {"run_id": run_id} if run_id else None), context_id)


def new_context(deps: Deps, caller: Caller, cmd: VmCodeContextNewIn) -> ContextOut:
    """`rift_vm_code_context_new`: start a kernel of its own in the VM's guest."""
    _task, vm, port = guest_vm(deps, caller, cmd.handle, cmd.vm_id)
    context_id = new_context_id()
    answer = ask(port, vm, req("POST", "/contexts", KERNEL_START_S, {
        "id": context_id, "language": cmd.language, "cwd": cmd.cwd}), context_id,
        failed_field="cwd" if cmd.cwd else None)
    made = code_views.context(vm.id, answer)
    code_records.made(deps, vm, made)
    return ContextOut(context=made)


def list_contexts(deps: Deps, caller: Caller, cmd: VmCodeContextListIn) -> ContextListOut:
    """`rift_vm_code_context_list`: the VM's contexts as its guest keeps them."""
    _task, vm, port = guest_vm(deps, caller, cmd.handle, cmd.vm_id)
    listed = code_views.contexts(vm.id, ask(port, vm, req("GET", "/contexts", 0), DEFAULT))
    code_records.synced(deps, vm, listed)
    return ContextListOut(contexts=listed)


def restart(deps: Deps, caller: Caller, cmd: VmCodeContextIn) -> ContextOut:
    """`rift_vm_code_context_restart`: a new kernel for the context; its state is gone."""
    _task, vm, port = guest_vm(deps, caller, cmd.handle, cmd.vm_id)
    answer = ask(port, vm, req("POST", f"/contexts/{cmd.context_id}/restart",
                                 KERNEL_START_S), cmd.context_id)
    started = code_views.context(vm.id, answer)
    code_records.made(deps, vm, started)
    return ContextOut(context=started)


def delete(deps: Deps, caller: Caller, cmd: VmCodeContextIn) -> ContextOut:
    """`rift_vm_code_context_delete`: stop the context's kernel and forget it."""
    _task, vm, port = guest_vm(deps, caller, cmd.handle, cmd.vm_id)
    found = code_views.contexts(vm.id, ask(port, vm, req("GET", "/contexts", 0), DEFAULT))
    gone = next((one for one in found if one.id == cmd.context_id), None)
    if gone is None:
        raise ContextNotFound(cmd.context_id, vm.id)
    ask(port, vm, req("DELETE", f"/contexts/{cmd.context_id}", 0), cmd.context_id)
    code_records.deleted(deps, vm, cmd.context_id)
    return ContextOut(context=gone.model_copy(update={"alive": False, "running": None}))


def code_ready(deps: Deps, vm: Vm) -> None:
    """A pooled VM's code server started with its default context's kernel, and that
    kernel warm (started, its first cell run), so the VM (or its saved state) is
    handed out with the kernel ready: its first run costs what a later one does. A
    kernel still starting after WARM_S is handed out as it is (its first run waits
    for it); a guest without python3 (`tiny`) or that cannot start it, too."""
    if vm.ssh_port is None:  # no guest behind it (libvirt's test driver)
        return
    try:
        deps.code.start(vm)
        deps.code.request(vm, req("GET", f"/health?wait_ms={int(WARM_S * 1000)}", WARM_S))
    except (GuestUnreachable, NoPython) as exc:
        deps.log.info("pool vm runs no code server", extra={"vm_id": vm.id,
                                                            "error": str(exc)[:200]})


# -- helpers ------------------------------------------------------------------------------

def guest_vm(deps: Deps, caller: Caller, handle: str | None, vm_id: str,
              begin: RunStart | None = None) -> tuple[Task, Vm, GuestCode]:
    """The handle's task, its running VM (woken when it sleeps) and the port to it;
    with `begin`, the run recorded in flight in the same transaction."""
    parsed = parse_handle(handle)

    def work(tx: Tx) -> tuple[Task, Vm]:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        vm = task_vm(tx, task, vm_id, running=False)
        if begin is not None and vm.status == "running" and vm.change in (None, "moving"):
            code_records.run_begun(tx, vm, begin, now)
        return task, vm

    def checked() -> tuple[Task, Vm]:
        task, vm = in_write(deps.store, work)
        check_running(vm)  # after the write: the handle's check stands either way
        return task, vm

    task, vm = awake(deps, caller.label, checked)  # SPEC §17
    reach(vm, deps.guests.files)  # a guest behind it (not the test driver's), reachable
    deps.code.reachable(vm)
    return task, vm, deps.code


def req(method: Any, path: str, wait_s: float, body: dict[str, Any] | None = None,
         ) -> CodeRequest:
    return CodeRequest(method=method, path=path, body=body, timeout_s=wait_s + SLACK_S)


def ask(port: GuestCode, vm: Vm, request: CodeRequest, context_id: str, *,
         failed_field: str | None = None) -> Any:
    """The guest server's answer to one request; its refusals as Rift's."""
    try:
        answer = port.request(vm, request)
    except NoPython as exc:
        raise InvalidArgument("vm_id", f"the guest of {vm.id} has no python3 to run code: "
                              "make a VM of an image that has (debian, python)") from exc
    if answer.status == 404 and isinstance(answer.body, dict) \
            and answer.body.get("error") == "context_not_found":
        raise ContextNotFound(context_id, vm.id)
    if answer.status == 404 and isinstance(answer.body, dict) \
            and answer.body.get("error") == "run_not_found":
        run_id = request.path.removeprefix("/runs/").partition("?")[0]
        raise InvalidArgument("run_id", f"the guest of {vm.id} keeps no run {run_id} (it "
                              f"keeps its last {RUNS_KEPT}, and none across a reboot)")
    if answer.status != 200:
        said = str(answer.body.get("message", "") if isinstance(answer.body, dict) else "")
        if failed_field is not None:
            raise InvalidArgument(failed_field, f"the guest could not start the kernel: "
                                  f"{said[:300]}")
        raise GuestUnreachable(vm.id, f"rift-code answered {answer.status}: {said[:300]}")
    return answer.body
