"""REST `/api/v1` (SPEC §5): the same use cases as the MCP tools, with the same
contracts (rift/contract/: one module per resource, `tools.CONTRACTS` lists them).

A route's body or query is the tool's input model less what travels in the path
and the `Rift-Handle` header; the route puts those back, calls the tool's use case
with the input model, and answers its output model. Routes are plain `def`: FastAPI runs them in
worker threads, so the blocking engine (SQLite, libvirt, SSH) never runs on the
event loop. The routes that wait (an exec's end, a long poll, a VM's boot, an
exec's stream) are `async def` instead and run the call on the waiting calls'
own threads, within the caller's budget of waiting calls (rift/api/waiting.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from rift.api.auth import rest_caller
from rift.api.exec_stream import STREAM_WAIT_S, exec_events, resumed
from rift.api.gate import OffLoopRoute
from rift.api.state import AppState
from rift.api.waiting import HeldStream
from rift.contract import tools as c
from rift.contract.base import (
    ExecId,
    HandleText,
    Input,
    SnapshotId,
    Takeover,
    TaskId,
    VmId,
    command,
)
from rift.contract.base import Path as GuestPathText
from rift.contract.tool import ToolContract
from rift.contract.views import ExecView
from rift.domain.errors import InvalidArgument, RiftError
from rift.domain.secrets import Handle
from rift.services.context import Caller, Deps
from rift.services.lifecycle import (
    execs,
    exposures,
    files,
    forks,
    leases,
    pauses,
    snapshots,
    tasks,
    vms,
)

UseCase = Callable[[Deps, Caller, Any], BaseModel]

CallerDep = Annotated[Caller, Depends(rest_caller)]
# Path, query and header parameters take their types from the contract, like bodies.
HandleHeader = Annotated[HandleText | None, Header(alias="Rift-Handle")]
TaskIdPath = Annotated[TaskId, Path()]
VmIdPath = Annotated[VmId, Path()]
ExecIdPath = Annotated[ExecId, Path()]
SnapshotIdPath = Annotated[SnapshotId, Path()]
GuestPath = Annotated[GuestPathText, Query()]


def _guest_file(vm_id: VmIdPath, path: GuestPath) -> dict[str, str]:
    """A file of a VM: the VM in the path, the file's path in the query."""
    return {"vm_id": vm_id, "path": path}


def _stream_headers(
        handle: HandleHeader = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> tuple[str | None, str | None]:
    """An exec stream's headers: the handle, and the event to resume after."""
    return handle, last_event_id


GuestFile = Annotated[dict[str, str], Depends(_guest_file)]
StreamHeaders = Annotated[tuple[str | None, str | None], Depends(_stream_headers)]
REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {"model": c.Refusal, "description": "a refusal: {error: {code, message, hint}}"}
    for code in (400, 401, 404, 409, 422, 429, 503)
}

router = APIRouter(prefix="/api/v1", responses=REFUSALS, route_class=OffLoopRoute)


def run(request: Request, caller: Caller, contract: ToolContract, call: UseCase,
        args: Input | None = None, **fields: Any) -> Any:
    """The tool's use case, with its input model made of `args` (a body or query that
    already passed the model) and `fields` from the path and headers (`None` ones
    left out), counted in the metrics by tool name and outcome."""
    state: AppState = request.app.state.rift
    tool = contract.name
    given = {**(args.given() if args is not None else {}),
             **{k: v for k, v in fields.items() if v is not None}}
    try:
        out = call(state.deps, caller, contract.input.model_validate(given))
    except RiftError as exc:
        state.metrics.record("rest", tool, exc.code)
        raise
    except Exception:
        state.metrics.record("rest", tool, "internal")
        raise
    state.metrics.record("rest", tool, "ok")
    return out


async def waited(request: Request, caller: Caller, contract: ToolContract, call: UseCase,
                 args: Input | None = None, **fields: Any) -> Any:
    """`run` on the waiting calls' threads; holding one of the caller's places
    while it runs unless it asks for no wait (`wait_s` 0)."""
    state: AppState = request.app.state.rift
    waits = getattr(args, "wait_s", None) != 0
    return await state.waiting.run(caller.user if waits else None,
                                   partial(run, request, caller, contract, call, args, **fields))


def _same_task(task_id: str, handle: str | None) -> None:
    parsed = Handle.parse(handle) if handle else None
    if parsed is not None and parsed.task_id != task_id:
        raise InvalidArgument("Rift-Handle", f"the handle is for {parsed.task_id}, not {task_id}")


@router.get("/tasks", response_model=c.TaskListOut, summary="your tasks, newest first")
def list_tasks(request: Request, caller: CallerDep,
               query: Annotated[c.TaskListIn, Query()]) -> Any:
    return run(request, caller, c.TASK_LIST, tasks.list_tasks, query)


@router.post("/tasks", response_model=c.TaskNewOut, status_code=201,
             summary="open a task; the caller holds it")
def new_task(request: Request, caller: CallerDep, body: c.TaskNewIn | None = None) -> Any:
    return run(request, caller, c.TASK_NEW, tasks.new, body)


@router.get("/tasks/{task_id}", response_model=c.TaskOut,
            summary="a task; with Rift-Handle this is activity on it")
def get_task(request: Request, caller: CallerDep, task_id: TaskIdPath,
             handle: HandleHeader = None) -> Any:
    _same_task(task_id, handle)
    if handle is not None:
        return run(request, caller, c.TASK_GET, tasks.get, handle=handle)
    return run(request, caller, c.TASK_GET, tasks.get, task_id=task_id)


@router.post("/tasks/{task_id}/attach", response_model=c.TaskAttachOut,
             summary="take up a task: a new handle; the previous one stops working")
def attach(request: Request, caller: CallerDep, task_id: TaskIdPath,
           body: c.TakeoverBody | None = None) -> Any:
    return run(request, caller, c.TASK_ATTACH, leases.attach, body, task_id=task_id)


@router.post("/tasks/{task_id}/release", response_model=c.TaskOut,
             summary="let go of a task; it stays open and its VMs keep running")
def release(request: Request, caller: CallerDep, task_id: TaskIdPath,
            handle: HandleHeader = None) -> Any:
    _same_task(task_id, handle)
    return run(request, caller, c.TASK_RELEASE, leases.release, handle=handle)


@router.post("/tasks/{task_id}/close", response_model=c.TaskCloseOut,
             summary="close a task and destroy its VMs (by handle, or by id with attach's rules)")
def close(request: Request, caller: CallerDep, task_id: TaskIdPath, handle: HandleHeader = None,
          body: c.TakeoverBody | None = None) -> Any:
    _same_task(task_id, handle)
    if handle is not None:
        return run(request, caller, c.TASK_CLOSE, tasks.close, handle=handle)
    return run(request, caller, c.TASK_CLOSE, tasks.close, body, task_id=task_id)


@router.get("/tasks/{task_id}/events", response_model=c.TaskEventsOut,
            summary="a task's event log, oldest first")
def events(request: Request, caller: CallerDep, task_id: TaskIdPath,
           query: Annotated[c.EventsQuery, Query()]) -> Any:
    return run(request, caller, c.TASK_EVENTS, tasks.events, query, task_id=task_id)


@router.post("/tasks/{task_id}/vms", response_model=c.VmOut, status_code=201,
             summary="a new VM in the task; answers when it runs or failed")
async def new_vm(request: Request, caller: CallerDep, task_id: TaskIdPath,
                 handle: HandleHeader = None, body: c.VmNewBody | None = None) -> Any:
    _same_task(task_id, handle)
    return await waited(request, caller, c.VM_NEW, vms.new, body, handle=handle)


@router.get("/vms/{vm_id}", response_model=c.VmOut, summary="a VM")
def get_vm(request: Request, caller: CallerDep, vm_id: VmIdPath) -> Any:
    return run(request, caller, c.VM_GET, vms.get, vm_id=vm_id)


@router.delete("/vms/{vm_id}", response_model=c.VmOut,
               summary="destroy a VM (by handle, or by id with attach's rules)")
def destroy_vm(request: Request, caller: CallerDep, vm_id: VmIdPath, handle: HandleHeader = None,
               takeover: Annotated[Takeover, Query()] = False) -> Any:
    return run(request, caller, c.VM_DESTROY, vms.destroy, vm_id=vm_id, handle=handle,
               takeover=takeover)


@router.post("/vms/{vm_id}/pause", response_model=c.VmOut, summary="pause a VM")
def pause_vm(request: Request, caller: CallerDep, vm_id: VmIdPath,
             handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_PAUSE, pauses.pause, handle=handle, vm_id=vm_id)


@router.post("/vms/{vm_id}/resume", response_model=c.VmOut, summary="resume a paused VM")
def resume_vm(request: Request, caller: CallerDep, vm_id: VmIdPath,
              handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_RESUME, pauses.resume, handle=handle, vm_id=vm_id)


@router.post("/vms/{vm_id}/snapshots", response_model=c.SnapshotOut, status_code=201,
             summary="snapshot a VM (its memory and disk as of now)")
def snapshot_vm(request: Request, caller: CallerDep, vm_id: VmIdPath,
                body: c.SnapshotBody | None = None, handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_SNAPSHOT, snapshots.make, body, handle=handle, vm_id=vm_id)


@router.delete("/snapshots/{snapshot_id}", response_model=c.SnapshotOut,
               summary="delete a snapshot")
def delete_snapshot(request: Request, caller: CallerDep, snapshot_id: SnapshotIdPath,
                    handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_SNAPSHOT_DELETE, snapshots.delete, handle=handle,
               snapshot_id=snapshot_id)


@router.post("/snapshots/{snapshot_id}/fork", response_model=c.VmsOut, status_code=201,
             summary="new VMs from a snapshot")
async def fork_snapshot(request: Request, caller: CallerDep, snapshot_id: SnapshotIdPath,
                        body: c.ForkBody | None = None, handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_FORK, forks.fork, body, handle=handle,
                        snapshot_id=snapshot_id)


@router.post("/vms/{vm_id}/fork", response_model=c.VmsOut, status_code=201,
             summary="new VMs from a running VM (snapshotted first)")
async def fork_vm(request: Request, caller: CallerDep, vm_id: VmIdPath,
                  body: c.ForkBody | None = None, handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_FORK, forks.fork, body, handle=handle,
                        vm_id=vm_id)


@router.post("/vms/{vm_id}/exposures", response_model=c.ExposureOut, status_code=201,
             summary="expose a guest port at a URL of its own (shown only in this answer)")
def expose_port(request: Request, caller: CallerDep, vm_id: VmIdPath, body: c.PortBody,
                handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_EXPOSE, exposures.expose, body, handle=handle, vm_id=vm_id)


@router.delete("/vms/{vm_id}/exposures/{port}", response_model=c.VmOut,
               summary="end a guest port's exposure")
def unexpose_port(request: Request, caller: CallerDep, vm_id: VmIdPath,
                  port: Annotated[c.GuestPort, Path()], handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_UNEXPOSE, exposures.unexpose, handle=handle, vm_id=vm_id,
               port=port)


@router.post("/vms/{vm_id}/exec", response_model=ExecView,
             summary="run a command in the VM; answers at its end or after wait_s")
async def exec_command(request: Request, caller: CallerDep, vm_id: VmIdPath, body: c.ExecBody,
                       handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_EXEC, execs.start, body, handle=handle,
                        vm_id=vm_id)


@router.get("/vms/{vm_id}/execs", response_model=c.ExecListOut,
            summary="the VM's execs (running ones, or all)")
def list_execs(request: Request, caller: CallerDep, vm_id: VmIdPath,
               query: Annotated[c.ExecListQuery, Query()], handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_EXEC_LIST, execs.list_execs, query, handle=handle, vm_id=vm_id)


@router.get("/execs/{exec_id}", response_model=ExecView,
            summary="an exec and its output from the offsets (waiting up to wait_s)")
async def get_exec(request: Request, caller: CallerDep, exec_id: ExecIdPath,
                   query: Annotated[c.ExecGetQuery, Query()], handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_EXEC_GET, execs.get, query,
                        handle=handle, exec_id=exec_id)


@router.get("/execs/{exec_id}/stream", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": (
                "Server-Sent Events: `stdout` and `stderr` ({text, next_offset, truncated?}), "
                "each with an `id` to resume from (Last-Event-ID), then `end` (the exec view "
                "without output), or `refused` ({error}) if the lease moved on")}},
            summary="the exec's output as Server-Sent Events until its end")
async def stream_exec(request: Request, caller: CallerDep, exec_id: ExecIdPath,
                      query: Annotated[c.ExecStreamQuery, Query()], headers: StreamHeaders,
                      ) -> StreamingResponse:
    handle, last_event_id = headers
    offsets = resumed(last_event_id) or (query.stdout_offset, query.stderr_offset)
    state: AppState = request.app.state.rift
    give = state.waiting.take(caller.user)  # a stream waits: one of the caller's places
    try:
        # The first read is an ordinary call: a refusal is an ordinary answer, before any event.
        first: ExecView = await state.waiting.run(None, partial(
            run, request, caller, c.VM_EXEC_GET, execs.get, handle=handle, exec_id=exec_id,
            stdout_offset=offsets[0], stderr_offset=offsets[1]))
    except BaseException:
        give()
        raise
    deps = state.deps
    events = exec_events(first, lambda out, err: execs.get(deps, caller, command(
        c.VmExecGetIn, handle=handle, exec_id=exec_id, stdout_offset=out, stderr_offset=err,
        wait_s=STREAM_WAIT_S)))
    return HeldStream(state.waiting.iterate(events), give, media_type="text/event-stream",
                      headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/execs/{exec_id}/input", response_model=c.ExecInputOut,
             summary="write to an exec's stdin (eof closes it)")
def exec_input(request: Request, caller: CallerDep, exec_id: ExecIdPath,
               body: c.ExecInputBody, handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_EXEC_INPUT, execs.send_input, body, handle=handle,
               exec_id=exec_id)


@router.post("/execs/{exec_id}/kill", response_model=ExecView,
             summary="signal an exec's process group (TERM, then KILL 5 s later)")
def kill_exec(request: Request, caller: CallerDep, exec_id: ExecIdPath,
              body: c.ExecKillBody | None = None, handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_EXEC_KILL, execs.kill, body, handle=handle, exec_id=exec_id)


@router.put("/vms/{vm_id}/files", response_model=c.FileWrittenOut,
            summary="write a file in the VM")
def write_file(request: Request, caller: CallerDep, file: GuestFile, body: c.FileBody,
               handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_WRITE_FILE, files.write, body, handle=handle, **file)


@router.get("/vms/{vm_id}/files", response_model=c.FileReadOut,
            summary="read a file from the VM")
def read_file(request: Request, caller: CallerDep, file: GuestFile,
              encoding: Annotated[c.Encoding, Query()] = "utf-8",
              handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_READ_FILE, files.read, None, handle=handle, encoding=encoding,
               **file)
