"""The thirteen calls of SPEC §3, each answering exactly the tool's output.

MCP tools and REST routes both call these (no door holds a rule of its own);
each is blocking: doors run them in a worker thread.
"""

from __future__ import annotations

from typing import Any

from rift.services import guests, leases, tasks, vms
from rift.services.context import Caller, Deps
from rift.services.views import task_view


def _task_out(deps: Deps, task_id: str) -> dict[str, Any]:
    with deps.store.read() as tx:
        task = tx.get_task(task_id)
        assert task is not None
        return task_view(task, tx.list_vms(task_id), deps.clocks)


def task_new(deps: Deps, caller: Caller, name: str | None = None,
             idempotency_key: str | None = None) -> dict[str, Any]:
    opened = tasks.new_task(deps, caller, name, idempotency_key)
    return {"task": opened.task, "handle": str(opened.handle)}


def task_attach(deps: Deps, caller: Caller, task_id: str,
                takeover: bool | None = None) -> dict[str, Any]:
    won = leases.attach(deps, caller, task_id, bool(takeover))
    return {"task": _task_out(deps, won.task.id), "handle": str(won.handle),
            "previous_holder": won.previous_holder}


def task_release(deps: Deps, caller: Caller, handle: str | None = None) -> dict[str, Any]:
    released = leases.release(deps, caller, handle)
    return {"task": _task_out(deps, released.id)}


def task_close(deps: Deps, caller: Caller, handle: str | None = None,
               task_id: str | None = None, takeover: bool | None = None) -> dict[str, Any]:
    return tasks.close_task(deps, caller, handle=handle, task_id=task_id,
                            takeover=bool(takeover))


def task_list(deps: Deps, caller: Caller, status: str | None = None, limit: int | None = None,
              after: str | None = None) -> dict[str, Any]:
    return tasks.list_tasks(deps, caller, status, limit, after)


def task_get(deps: Deps, caller: Caller, task_id: str | None = None,
             handle: str | None = None) -> dict[str, Any]:
    return {"task": tasks.get_task(deps, caller, task_id=task_id, handle=handle)}


def task_events(deps: Deps, caller: Caller, task_id: str, after_id: int | None = None,
                limit: int | None = None) -> dict[str, Any]:
    return tasks.task_events(deps, caller, task_id, after_id, limit)


def vm_new(deps: Deps, caller: Caller, handle: str | None = None, name: str | None = None,
           image: str | None = None, vcpus: int | None = None, memory_mib: int | None = None,
           idempotency_key: str | None = None) -> dict[str, Any]:
    return {"vm": vms.new_vm(deps, caller, handle, name, image, vcpus, memory_mib,
                             idempotency_key)}


def vm_get(deps: Deps, caller: Caller, vm_id: str) -> dict[str, Any]:
    return {"vm": vms.get_vm(deps, caller, vm_id)}


def vm_destroy(deps: Deps, caller: Caller, vm_id: str, handle: str | None = None,
               takeover: bool | None = None) -> dict[str, Any]:
    return {"vm": vms.destroy(deps, caller, vm_id, handle, bool(takeover))}


def vm_exec(deps: Deps, caller: Caller, handle: str | None, vm_id: str, command: str,
            stdin: str | None = None, timeout_s: int | None = None) -> dict[str, Any]:
    return guests.exec_command(deps, caller, handle, vm_id, command, stdin, timeout_s)


def vm_write_file(deps: Deps, caller: Caller, handle: str | None, vm_id: str, path: str,
                  content: str, encoding: str | None = None,
                  mode: int | None = None) -> dict[str, Any]:
    return guests.write_file(deps, caller, handle, vm_id, path, content, encoding, mode)


def vm_read_file(deps: Deps, caller: Caller, handle: str | None, vm_id: str, path: str,
                 encoding: str | None = None) -> dict[str, Any]:
    return guests.read_file(deps, caller, handle, vm_id, path, encoding)
