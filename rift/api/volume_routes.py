"""REST `/api/v1` for volumes (SPEC §18): the same use cases as the MCP tools
(rift/contract/volumes.py), added to `rest.py`'s router (`router` here is that
router, with these routes; rift.app installs it from here)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Request

from rift.api.rest import CallerDep, HandleHeader, VmIdPath, router, run, waited
from rift.contract import tools as c
from rift.services.lifecycle import volume_attach, volumes

VolumeIdPath = Annotated[c.VolumeId, Path()]
__all__ = ["router"]


@router.get("/volumes", response_model=c.VolumeListOut, summary="your volumes")
def list_volumes(request: Request, caller: CallerDep) -> Any:
    return run(request, caller, c.VOLUME_LIST, volumes.list_volumes)


@router.post("/volumes", response_model=c.VolumeOut, status_code=201,
             summary="make an empty ext4 volume of yours")
def new_volume(request: Request, caller: CallerDep, body: c.VolumeNewIn) -> Any:
    return run(request, caller, c.VOLUME_NEW, volumes.new, body)


@router.get("/volumes/{volume_id}", response_model=c.VolumeOut, summary="one volume of yours")
def get_volume(request: Request, caller: CallerDep, volume_id: VolumeIdPath) -> Any:
    return run(request, caller, c.VOLUME_GET, volumes.get, volume_id=volume_id)


@router.delete("/volumes/{volume_id}", response_model=c.VolumeOut,
               summary="delete a volume (refused while attached)")
def delete_volume(request: Request, caller: CallerDep, volume_id: VolumeIdPath) -> Any:
    return run(request, caller, c.VOLUME_DELETE, volumes.delete, volume_id=volume_id)


@router.post("/volumes/{volume_id}/resize", response_model=c.VolumeOut,
             summary="grow a volume (never shrink)")
def resize_volume(request: Request, caller: CallerDep, volume_id: VolumeIdPath,
                  body: c.ResizeBody) -> Any:
    return run(request, caller, c.VOLUME_RESIZE, volumes.resize, body, volume_id=volume_id)


@router.post("/volumes/{volume_id}/clone", response_model=c.VolumeOut, status_code=201,
             summary="a copy-on-write copy of a volume, in constant time")
def clone_volume(request: Request, caller: CallerDep, volume_id: VolumeIdPath,
                 body: c.CloneBody) -> Any:
    return run(request, caller, c.VOLUME_CLONE, volumes.clone, body, volume_id=volume_id)


@router.post("/vms/{vm_id}/volumes", response_model=c.VmOut,
             summary="attach a volume to a running VM and mount it at path")
async def attach_volume(request: Request, caller: CallerDep, vm_id: VmIdPath,
                        body: c.AttachBody, handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_ATTACH_VOLUME, volume_attach.attach, body,
                        handle=handle, vm_id=vm_id)


@router.delete("/vms/{vm_id}/volumes/{volume_id}", response_model=c.VmOut,
               summary="unmount and detach a volume from a VM")
async def detach_volume(request: Request, caller: CallerDep, vm_id: VmIdPath,
                        volume_id: VolumeIdPath, handle: HandleHeader = None) -> Any:
    return await waited(request, caller, c.VM_DETACH_VOLUME, volume_attach.detach,
                        handle=handle, vm_id=vm_id, volume_id=volume_id)
