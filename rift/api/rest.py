"""REST `/api/v1` (SPEC §5): the same engine calls as the MCP tools, with the
same contracts (rift/contract/tools.py).

A route's body or query is the tool's input model less what travels in the path
and the `Rift-Handle` header; the route puts those back and makes the tool's own
call, and answers its output model. Routes are plain `def`: FastAPI runs them in
worker threads, so the blocking engine (SQLite, libvirt, SSH) never runs on the
event loop.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request

from rift.api.auth import rest_caller
from rift.api.state import AppState
from rift.contract import tools as c
from rift.contract.base import ExecId, HandleText, Input, Takeover, TaskId, VmId
from rift.contract.base import Path as GuestPathText
from rift.contract.views import ExecView
from rift.domain.errors import InvalidArgument, RiftError
from rift.domain.secrets import Handle
from rift.services.context import Caller
from rift.services.tools import CALLS

CallerDep = Annotated[Caller, Depends(rest_caller)]
# Path, query and header parameters take their types from the contract, like bodies.
HandleHeader = Annotated[HandleText | None, Header(alias="Rift-Handle")]
TaskIdPath = Annotated[TaskId, Path()]
VmIdPath = Annotated[VmId, Path()]
ExecIdPath = Annotated[ExecId, Path()]
GuestPath = Annotated[GuestPathText, Query()]
REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {"model": c.Refusal, "description": "a refusal: {error: {code, message, hint}}"}
    for code in (400, 401, 404, 409, 422, 429, 503)
}

router = APIRouter(prefix="/api/v1", responses=REFUSALS)


def run(request: Request, tool: str, caller: Caller, args: Input | None = None,
        **fields: Any) -> Any:
    """The tool's own engine call, with its input model made of `args` (a body or
    query that already passed the model) and `fields` from the path and headers
    (`None` ones left out), counted in the metrics by tool name and outcome."""
    state: AppState = request.app.state.rift
    contract = c.CONTRACTS[tool]
    given = {**(args.given() if args is not None else {}),
             **{k: v for k, v in fields.items() if v is not None}}
    try:
        out = CALLS[tool](state.deps, caller, contract.input.model_validate(given))
    except RiftError as exc:
        state.metrics.record("rest", tool, exc.code)
        raise
    except Exception:
        state.metrics.record("rest", tool, "internal")
        raise
    state.metrics.record("rest", tool, "ok")
    return out


def _same_task(task_id: str, handle: str | None) -> None:
    parsed = Handle.parse(handle) if handle else None
    if parsed is not None and parsed.task_id != task_id:
        raise InvalidArgument("Rift-Handle", f"the handle is for {parsed.task_id}, not {task_id}")


@router.get("/tasks", response_model=c.TaskListOut, summary="your tasks, newest first")
def list_tasks(request: Request, caller: CallerDep,
               query: Annotated[c.TaskListIn, Query()]) -> Any:
    return run(request, "rift_task_list", caller, query)


@router.post("/tasks", response_model=c.TaskNewOut, status_code=201,
             summary="open a task; the caller holds it")
def new_task(request: Request, caller: CallerDep, body: c.TaskNewIn | None = None) -> Any:
    return run(request, "rift_task_new", caller, body)


@router.get("/tasks/{task_id}", response_model=c.TaskOut,
            summary="a task; with Rift-Handle this is activity on it")
def get_task(request: Request, caller: CallerDep, task_id: TaskIdPath,
             handle: HandleHeader = None) -> Any:
    _same_task(task_id, handle)
    if handle is not None:
        return run(request, "rift_task_get", caller, handle=handle)
    return run(request, "rift_task_get", caller, task_id=task_id)


@router.post("/tasks/{task_id}/attach", response_model=c.TaskAttachOut,
             summary="take up a task: a new handle; the previous one stops working")
def attach(request: Request, caller: CallerDep, task_id: TaskIdPath,
           body: c.TakeoverBody | None = None) -> Any:
    return run(request, "rift_task_attach", caller, body, task_id=task_id)


@router.post("/tasks/{task_id}/release", response_model=c.TaskOut,
             summary="let go of a task; it stays open and its VMs keep running")
def release(request: Request, caller: CallerDep, task_id: TaskIdPath,
            handle: HandleHeader = None) -> Any:
    _same_task(task_id, handle)
    return run(request, "rift_task_release", caller, handle=handle)


@router.post("/tasks/{task_id}/close", response_model=c.TaskCloseOut,
             summary="close a task and destroy its VMs (by handle, or by id with attach's rules)")
def close(request: Request, caller: CallerDep, task_id: TaskIdPath, handle: HandleHeader = None,
          body: c.TakeoverBody | None = None) -> Any:
    _same_task(task_id, handle)
    if handle is not None:
        return run(request, "rift_task_close", caller, handle=handle)
    return run(request, "rift_task_close", caller, body, task_id=task_id)


@router.get("/tasks/{task_id}/events", response_model=c.TaskEventsOut,
            summary="a task's event log, oldest first")
def events(request: Request, caller: CallerDep, task_id: TaskIdPath,
           query: Annotated[c.EventsQuery, Query()]) -> Any:
    return run(request, "rift_task_events", caller, query, task_id=task_id)


@router.post("/tasks/{task_id}/vms", response_model=c.VmOut, status_code=201,
             summary="a new VM in the task; answers when it runs or failed")
def new_vm(request: Request, caller: CallerDep, task_id: TaskIdPath, handle: HandleHeader = None,
           body: c.VmNewBody | None = None) -> Any:
    _same_task(task_id, handle)
    return run(request, "rift_vm_new", caller, body, handle=handle)


@router.get("/vms/{vm_id}", response_model=c.VmOut, summary="a VM")
def get_vm(request: Request, caller: CallerDep, vm_id: VmIdPath) -> Any:
    return run(request, "rift_vm_get", caller, vm_id=vm_id)


@router.delete("/vms/{vm_id}", response_model=c.VmOut,
               summary="destroy a VM (by handle, or by id with attach's rules)")
def destroy_vm(request: Request, caller: CallerDep, vm_id: VmIdPath, handle: HandleHeader = None,
               takeover: Annotated[Takeover, Query()] = False) -> Any:
    return run(request, "rift_vm_destroy", caller, vm_id=vm_id, handle=handle,
               takeover=takeover)


@router.post("/vms/{vm_id}/exec", response_model=ExecView,
             summary="run a command in the VM; answers at its end or after wait_s")
def exec_command(request: Request, caller: CallerDep, vm_id: VmIdPath, body: c.ExecBody,
                 handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_exec", caller, body, handle=handle, vm_id=vm_id)


@router.get("/vms/{vm_id}/execs", response_model=c.ExecListOut,
            summary="the VM's execs (running ones, or all)")
def list_execs(request: Request, caller: CallerDep, vm_id: VmIdPath,
               query: Annotated[c.ExecListQuery, Query()], handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_exec_list", caller, query, handle=handle, vm_id=vm_id)


@router.get("/execs/{exec_id}", response_model=ExecView,
            summary="an exec and its output from the offsets (waiting up to wait_s)")
def get_exec(request: Request, caller: CallerDep, exec_id: ExecIdPath,
             query: Annotated[c.ExecGetQuery, Query()], handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_exec_get", caller, query, handle=handle, exec_id=exec_id)


@router.post("/execs/{exec_id}/input", response_model=c.ExecInputOut,
             summary="write to an exec's stdin (eof closes it)")
def exec_input(request: Request, caller: CallerDep, exec_id: ExecIdPath,
               body: c.ExecInputBody, handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_exec_input", caller, body, handle=handle, exec_id=exec_id)


@router.post("/execs/{exec_id}/kill", response_model=ExecView,
             summary="signal an exec's process group (TERM, then KILL 5 s later)")
def kill_exec(request: Request, caller: CallerDep, exec_id: ExecIdPath,
              body: c.ExecKillBody | None = None, handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_exec_kill", caller, body, handle=handle, exec_id=exec_id)


@router.put("/vms/{vm_id}/files", response_model=c.FileWrittenOut,
            summary="write a file in the VM")
def write_file(request: Request, caller: CallerDep, vm_id: VmIdPath, body: c.FileBody,
               path: GuestPath, handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_write_file", caller, body, handle=handle, vm_id=vm_id,
               path=path)


@router.get("/vms/{vm_id}/files", response_model=c.FileReadOut,
            summary="read a file from the VM")
def read_file(request: Request, caller: CallerDep, vm_id: VmIdPath, path: GuestPath,
              encoding: Annotated[c.Encoding, Query()] = "utf-8",
              handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_read_file", caller, handle=handle, vm_id=vm_id, path=path,
               encoding=encoding)
