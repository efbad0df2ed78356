"""REST `/api/v1` (SPEC §5): the same engine calls as the MCP tools.

Routes are plain `def`: FastAPI runs them in worker threads, so the blocking
engine (SQLite, libvirt, SSH) never runs on the event loop. The handle travels
in the `Rift-Handle` header.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request

from rift.api import schemas as s
from rift.api.auth import rest_caller
from rift.api.state import AppState
from rift.domain.errors import InvalidArgument, RiftError
from rift.domain.secrets import Handle
from rift.services import tools
from rift.services.context import Caller

CallerDep = Annotated[Caller, Depends(rest_caller)]
HandleHeader = Annotated[str | None, Header(alias="Rift-Handle", description=(
    "the task's handle, task_<id>.<secret>"))]
TaskId = Annotated[str, Path(pattern=s.TASK_ID, description="task_ + 8 base32 characters")]
VmId = Annotated[str, Path(pattern=s.VM_ID, description="vm_ + 8 base32 characters")]
REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {"model": s.ErrorOut, "description": "a refusal: {error: {code, message, hint}}"}
    for code in (400, 401, 404, 409, 422, 429, 503)
}

router = APIRouter(prefix="/api/v1", responses=REFUSALS)


def run(request: Request, tool: str, call: Callable[..., dict[str, Any]], caller: Caller,
        **kwargs: Any) -> dict[str, Any]:
    """One engine call, counted in the metrics by its tool name and outcome."""
    state: AppState = request.app.state.rift
    try:
        out = call(state.deps, caller, **kwargs)
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


@router.get("/tasks", response_model=s.TaskListOut, summary="your tasks, newest first")
def list_tasks(request: Request, caller: CallerDep,
               status: Annotated[str, Query(pattern="^(open|closed|all)$")] = "open",
               limit: Annotated[int, Query(ge=1, le=100)] = 50,
               after: Annotated[str | None, Query(pattern=s.TASK_ID)] = None) -> Any:
    return run(request, "rift_task_list", tools.task_list, caller, status=status, limit=limit,
               after=after)


@router.post("/tasks", response_model=s.TaskNewOut, status_code=201,
             summary="open a task; the caller holds it")
def new_task(request: Request, caller: CallerDep, body: s.TaskNewIn | None = None) -> Any:
    body = body or s.TaskNewIn()
    return run(request, "rift_task_new", tools.task_new, caller, name=body.name,
               idempotency_key=body.idempotency_key)


@router.get("/tasks/{task_id}", response_model=s.TaskOut,
            summary="a task; with Rift-Handle this is activity on it")
def get_task(request: Request, caller: CallerDep, task_id: TaskId,
             handle: HandleHeader = None) -> Any:
    _same_task(task_id, handle)
    if handle is not None:
        return run(request, "rift_task_get", tools.task_get, caller, handle=handle)
    return run(request, "rift_task_get", tools.task_get, caller, task_id=task_id)


@router.post("/tasks/{task_id}/attach", response_model=s.AttachOut,
             summary="take up a task: a new handle; the previous one stops working")
def attach(request: Request, caller: CallerDep, task_id: TaskId,
           body: s.TakeoverIn | None = None) -> Any:
    body = body or s.TakeoverIn()
    return run(request, "rift_task_attach", tools.task_attach, caller, task_id=task_id,
               takeover=body.takeover)


@router.post("/tasks/{task_id}/release", response_model=s.TaskOut,
             summary="let go of a task; it stays open and its VMs keep running")
def release(request: Request, caller: CallerDep, task_id: TaskId,
            handle: HandleHeader = None) -> Any:
    _same_task(task_id, handle)
    return run(request, "rift_task_release", tools.task_release, caller, handle=handle)


@router.post("/tasks/{task_id}/close", response_model=s.CloseOut,
             summary="close a task and destroy its VMs (by handle, or by id with attach's rules)")
def close(request: Request, caller: CallerDep, task_id: TaskId, handle: HandleHeader = None,
          body: s.TakeoverIn | None = None) -> Any:
    _same_task(task_id, handle)
    body = body or s.TakeoverIn()
    if handle is not None:
        return run(request, "rift_task_close", tools.task_close, caller, handle=handle)
    return run(request, "rift_task_close", tools.task_close, caller, task_id=task_id,
               takeover=body.takeover)


@router.get("/tasks/{task_id}/events", response_model=s.EventsOut,
            summary="a task's event log, oldest first")
def events(request: Request, caller: CallerDep, task_id: TaskId,
           after_id: Annotated[int | None, Query(ge=0, le=2**62)] = None,
           limit: Annotated[int, Query(ge=1, le=100)] = 50) -> Any:
    return run(request, "rift_task_events", tools.task_events, caller, task_id=task_id,
               after_id=after_id, limit=limit)


@router.post("/tasks/{task_id}/vms", response_model=s.VmOut, status_code=201,
             summary="a new VM in the task; answers when it runs or failed")
def new_vm(request: Request, caller: CallerDep, task_id: TaskId, handle: HandleHeader = None,
           body: s.VmNewIn | None = None) -> Any:
    _same_task(task_id, handle)
    body = body or s.VmNewIn()
    return run(request, "rift_vm_new", tools.vm_new, caller, handle=handle,
               **body.model_dump())


@router.get("/vms/{vm_id}", response_model=s.VmOut, summary="a VM")
def get_vm(request: Request, caller: CallerDep, vm_id: VmId) -> Any:
    return run(request, "rift_vm_get", tools.vm_get, caller, vm_id=vm_id)


@router.delete("/vms/{vm_id}", response_model=s.VmOut,
               summary="destroy a VM (by handle, or by id with attach's rules)")
def destroy_vm(request: Request, caller: CallerDep, vm_id: VmId, handle: HandleHeader = None,
               takeover: bool = False) -> Any:
    return run(request, "rift_vm_destroy", tools.vm_destroy, caller, vm_id=vm_id,
               handle=handle, takeover=takeover)


@router.post("/vms/{vm_id}/exec", response_model=s.ExecOut, summary="run a command in the VM")
def exec_command(request: Request, caller: CallerDep, vm_id: VmId, body: s.ExecIn,
                 handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_exec", tools.vm_exec, caller, handle=handle, vm_id=vm_id,
               **body.model_dump())


@router.put("/vms/{vm_id}/files", response_model=s.FileWrittenOut,
            summary="write a file in the VM")
def write_file(request: Request, caller: CallerDep, vm_id: VmId, body: s.FileIn,
               path: Annotated[str, Query(min_length=1, max_length=4096)],
               handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_write_file", tools.vm_write_file, caller, handle=handle,
               vm_id=vm_id, path=path, **body.model_dump())


@router.get("/vms/{vm_id}/files", response_model=s.FileReadOut,
            summary="read a file from the VM")
def read_file(request: Request, caller: CallerDep, vm_id: VmId,
              path: Annotated[str, Query(min_length=1, max_length=4096)],
              encoding: Annotated[str | None, Query(pattern="^(utf-8|base64)$")] = None,
              handle: HandleHeader = None) -> Any:
    return run(request, "rift_vm_read_file", tools.vm_read_file, caller, handle=handle,
               vm_id=vm_id, path=path, encoding=encoding)
