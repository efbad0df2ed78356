"""The calls of SPEC §3, §10 and §12: each takes its tool's input model and answers
its output model (rift/contract/tools.py).

MCP tools and REST routes both call these (no door holds a rule of its own);
each is blocking: doors run them in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rift.contract import tools as c
from rift.contract.views import ExecView, TaskView
from rift.services.context import Caller, Deps
from rift.services.lifecycle import execs, exposures, files, leases, pauses, snapshots, tasks, vms
from rift.services.ports.watch import Watch


def _task_out(deps: Deps, task_id: str) -> TaskView:
    with deps.store.read() as tx:
        task = tx.tasks.get(task_id)
        assert task is not None
        return tasks.view(deps, tx, task)


def task_new(deps: Deps, caller: Caller, args: c.TaskNewIn) -> c.TaskNewOut:
    opened = tasks.new_task(deps, caller, args.name, args.idempotency_key)
    return c.TaskNewOut(task=opened.task, handle=str(opened.handle))


def task_attach(deps: Deps, caller: Caller, args: c.TaskAttachIn) -> c.TaskAttachOut:
    won = leases.attach(deps, caller, args.task_id, args.takeover)
    return c.TaskAttachOut(task=_task_out(deps, won.task.id), handle=str(won.handle),
                           previous_holder=won.previous_holder)


def task_release(deps: Deps, caller: Caller, args: c.TaskReleaseIn) -> c.TaskOut:
    released = leases.release(deps, caller, args.handle)
    return c.TaskOut(task=_task_out(deps, released.id))


def task_close(deps: Deps, caller: Caller, args: c.TaskCloseIn) -> c.TaskCloseOut:
    return tasks.close_task(deps, caller, handle=args.handle, task_id=args.task_id,
                            takeover=args.takeover)


def task_list(deps: Deps, caller: Caller, args: c.TaskListIn) -> c.TaskListOut:
    return tasks.list_tasks(deps, caller, args.status, args.limit, args.after)


def task_get(deps: Deps, caller: Caller, args: c.TaskGetIn) -> c.TaskOut:
    return c.TaskOut(task=tasks.get_task(deps, caller, task_id=args.task_id,
                                         handle=args.handle))


def task_events(deps: Deps, caller: Caller, args: c.TaskEventsIn) -> c.TaskEventsOut:
    return tasks.task_events(deps, caller, args.task_id, args.after_id, args.limit)


def vm_new(deps: Deps, caller: Caller, args: c.VmNewIn, watch: Watch | None = None) -> c.VmOut:
    return c.VmOut(vm=vms.new_vm(deps, caller, args.handle, args.name, args.image, args.vcpus,
                                 args.memory_mib, args.idempotency_key, args.disk_gib,
                                 egress=args.egress, watch=watch))


def vm_get(deps: Deps, caller: Caller, args: c.VmGetIn) -> c.VmOut:
    return c.VmOut(vm=vms.get_vm(deps, caller, args.vm_id))


def vm_destroy(deps: Deps, caller: Caller, args: c.VmDestroyIn) -> c.VmOut:
    return c.VmOut(vm=vms.destroy(deps, caller, args.vm_id, args.handle, args.takeover))


def vm_pause(deps: Deps, caller: Caller, args: c.VmHeldIn) -> c.VmOut:
    return c.VmOut(vm=pauses.pause(deps, caller, args.handle, args.vm_id))


def vm_resume(deps: Deps, caller: Caller, args: c.VmHeldIn) -> c.VmOut:
    return c.VmOut(vm=pauses.resume(deps, caller, args.handle, args.vm_id))


def vm_snapshot(deps: Deps, caller: Caller, args: c.VmSnapshotIn) -> c.SnapshotOut:
    return c.SnapshotOut(snapshot=snapshots.make(deps, caller, args.handle, args.vm_id,
                                                 args.name))


def vm_snapshot_delete(deps: Deps, caller: Caller,
                       args: c.VmSnapshotDeleteIn) -> c.SnapshotOut:
    return c.SnapshotOut(snapshot=snapshots.delete(deps, caller, args.handle,
                                                   args.snapshot_id))


def vm_fork(deps: Deps, caller: Caller, args: c.VmForkIn) -> c.VmsOut:
    return c.VmsOut(vms=snapshots.fork(deps, caller, args.handle, args.snapshot_id,
                                       args.vm_id, args.name, args.count))


def vm_expose(deps: Deps, caller: Caller, args: c.VmPortIn) -> c.ExposureOut:
    return c.ExposureOut(exposure=exposures.expose(deps, caller, args.handle, args.vm_id,
                                                   args.port))


def vm_unexpose(deps: Deps, caller: Caller, args: c.VmPortIn) -> c.VmOut:
    return c.VmOut(vm=exposures.unexpose(deps, caller, args.handle, args.vm_id, args.port))


def vm_exec(deps: Deps, caller: Caller, args: c.VmExecIn, watch: Watch | None = None,
            ) -> ExecView:
    return execs.start(deps, caller, args.handle, args.vm_id, args.command, args.stdin,
                       args.timeout_s, args.wait_s, watch)


def vm_exec_get(deps: Deps, caller: Caller, args: c.VmExecGetIn, watch: Watch | None = None,
                ) -> ExecView:
    return execs.get(deps, caller, args.handle, args.exec_id, args.stdout_offset,
                     args.stderr_offset, args.wait_s, watch)


def vm_exec_input(deps: Deps, caller: Caller, args: c.VmExecInputIn) -> c.ExecInputOut:
    return execs.send_input(deps, caller, args.handle, args.exec_id, args.data, args.encoding,
                            args.eof)


def vm_exec_kill(deps: Deps, caller: Caller, args: c.VmExecKillIn) -> ExecView:
    return execs.kill(deps, caller, args.handle, args.exec_id, args.signal)


def vm_exec_list(deps: Deps, caller: Caller, args: c.VmExecListIn) -> c.ExecListOut:
    return execs.list_execs(deps, caller, args.handle, args.vm_id, args.status)


def vm_write_file(deps: Deps, caller: Caller, args: c.VmWriteFileIn) -> c.FileWrittenOut:
    return files.write_file(deps, caller, args.handle, args.vm_id, args.path, args.content,
                             args.encoding, args.mode)


def vm_read_file(deps: Deps, caller: Caller, args: c.VmReadFileIn) -> c.FileReadOut:
    return files.read_file(deps, caller, args.handle, args.vm_id, args.path, args.encoding)


Call = Callable[[Deps, Caller, Any], Any]

CALLS: dict[str, Call] = {
    "rift_task_new": task_new,
    "rift_task_attach": task_attach,
    "rift_task_release": task_release,
    "rift_task_close": task_close,
    "rift_task_list": task_list,
    "rift_task_get": task_get,
    "rift_task_events": task_events,
    "rift_vm_new": vm_new,
    "rift_vm_get": vm_get,
    "rift_vm_destroy": vm_destroy,
    "rift_vm_pause": vm_pause,
    "rift_vm_resume": vm_resume,
    "rift_vm_snapshot": vm_snapshot,
    "rift_vm_snapshot_delete": vm_snapshot_delete,
    "rift_vm_fork": vm_fork,
    "rift_vm_expose": vm_expose,
    "rift_vm_unexpose": vm_unexpose,
    "rift_vm_exec": vm_exec,
    "rift_vm_exec_get": vm_exec_get,
    "rift_vm_exec_input": vm_exec_input,
    "rift_vm_exec_kill": vm_exec_kill,
    "rift_vm_exec_list": vm_exec_list,
    "rift_vm_write_file": vm_write_file,
    "rift_vm_read_file": vm_read_file,
}


# -- the calls that wait (SPEC §10), and how a cancel ends what each made ------------------

WatchedCall = Callable[[Deps, Caller, Any, Watch | None], Any]

WATCHED: dict[str, WatchedCall] = {
    "rift_vm_new": vm_new,
    "rift_vm_exec": vm_exec,
    "rift_vm_exec_get": vm_exec_get,
}


def stop_made(deps: Deps, caller: Caller, tool: str, handle: str | None, target: str) -> None:
    """End what a cancelled call made or watched: kill the exec (TERM, then KILL
    5 s later), or destroy the VM. Under the call's own handle: a lease that
    moved on refuses it (`lease_stale`), and nothing changes."""
    if tool == "rift_vm_new":
        vms.destroy(deps, caller, target, handle)
    else:
        execs.kill(deps, caller, handle, target, "TERM")
