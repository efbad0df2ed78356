"""REST `/api/v1` for code contexts (SPEC §20): the same use cases as the MCP tools
(rift/contract/code.py), added to `rest.py`'s router (`router` here is that router,
with the volumes' routes and these; rift.app installs it from here)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request

from rift.api.rest import CallerDep, HandleHeader, VmIdPath, run, waited
from rift.api.volume_routes import router
from rift.contract import tools as c
from rift.contract.code import ContextId, RunId, RunWaitQuery
from rift.services.lifecycle import code

ContextIdPath = Annotated[ContextId, Path()]
RunIdPath = Annotated[RunId, Path()]


def _run_of(vm_id: VmIdPath, run_id: RunIdPath) -> dict[str, str]:
    """A run of a VM: both in the path."""
    return {"vm_id": vm_id, "run_id": run_id}


RunOfVm = Annotated[dict[str, str], Depends(_run_of)]
__all__ = ["router"]


@router.post("/vms/{vm_id}/code", response_model=c.RunCodeOut,
             summary="run code in a kernel that keeps its state; answers at its end or after "
                     "wait_s")
async def run_code(request: Request, caller: CallerDep, vm_id: VmIdPath, body: c.RunCodeBody,
                   handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_RUN_CODE, code.run, body, handle=handle,
                        vm_id=vm_id)


@router.get("/vms/{vm_id}/code/runs/{run_id}", response_model=c.RunCodeOut,
            summary="a run of code as it is now (waiting up to wait_s for its end)")
async def get_run(request: Request, caller: CallerDep, run: RunOfVm,
                  query: Annotated[RunWaitQuery, Query()], handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_RUN_CODE_GET, code.get_run, query,
                        handle=handle, **run)


@router.get("/vms/{vm_id}/code/contexts", response_model=c.ContextListOut,
            summary="the VM's code contexts")
def list_contexts(request: Request, caller: CallerDep, vm_id: VmIdPath,
                  handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_CODE_CONTEXT_LIST, code.list_contexts, handle=handle,
               vm_id=vm_id)


@router.post("/vms/{vm_id}/code/contexts", response_model=c.ContextOut, status_code=201,
             summary="start a kernel of its own: a new code context")
def new_context(request: Request, caller: CallerDep, vm_id: VmIdPath,
                body: c.ContextBody | None = None, handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_CODE_CONTEXT_NEW, code.new_context, body, handle=handle,
               vm_id=vm_id)


@router.post("/vms/{vm_id}/code/contexts/{context_id}/restart", response_model=c.ContextOut,
             summary="start the context's kernel anew (its state is gone)")
def restart_context(request: Request, caller: CallerDep, vm_id: VmIdPath,
                    context_id: ContextIdPath, handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_CODE_CONTEXT_RESTART, code.restart, handle=handle,
               vm_id=vm_id, context_id=context_id)


@router.delete("/vms/{vm_id}/code/contexts/{context_id}", response_model=c.ContextOut,
               summary="stop the context's kernel and forget it")
def delete_context(request: Request, caller: CallerDep, vm_id: VmIdPath,
                   context_id: ContextIdPath, handle: HandleHeader = None) -> Any:
    return run(request, caller, c.VM_CODE_CONTEXT_DELETE, code.delete, handle=handle,
               vm_id=vm_id, context_id=context_id)
