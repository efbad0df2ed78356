"""The volumes' tools (SPEC §18): a user's disks that outlive tasks (new, list, get,
delete, resize, clone), and attaching one to a running VM of a task (attach,
detach); their input models, answers and contracts."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rift.contract.base import HandleText, Input, Name, Output, SnapshotId, VmId, Whole
from rift.contract.tool import HELD, ToolContract
from rift.contract.views import VolumeView
from rift.contract.vms import AttachBody, VmOut, VolumeId
from rift.domain.volumes import MAX_VOLUME_GIB

SizeGib = Annotated[int, Field(ge=1, le=MAX_VOLUME_GIB, description=(
    "Its size in GiB (sparse: it takes on disk what is written; counted whole against "
    "your disk budget).")), Whole]


class VolumeNewIn(Input):
    name: Name
    size_gib: SizeGib


class VolumeListIn(Input):
    pass


class VolumeIdIn(Input):
    volume_id: VolumeId


class ResizeBody(Input):
    size_gib: SizeGib


class VolumeResizeIn(ResizeBody):
    volume_id: VolumeId


class CloneBody(Input):
    name: Name
    snapshot_id: Annotated[SnapshotId | None, Field(description=(
        "A snapshot of yours (rift_vm_snapshot) of a VM that held volume_id: the clone "
        "holds the volume as it was when the snapshot was taken. volume_id need not "
        "exist any more."))] = None


class VolumeCloneIn(CloneBody):
    volume_id: VolumeId


class VmAttachVolumeIn(AttachBody):
    handle: HandleText | None = None
    vm_id: VmId


class VmDetachVolumeIn(Input):
    handle: HandleText | None = None
    vm_id: VmId
    volume_id: VolumeId


class VolumeOut(Output):
    volume: VolumeView


class VolumeListOut(Output):
    volumes: list[VolumeView]


VOLUME_NEW = ToolContract(
    "rift_volume_new", "Make a volume",
    "Make a volume of yours: an empty ext4 disk of size_gib that outlives tasks, for "
    "work, caches and data to come back to; rift_vm_attach_volume mounts it in a VM.",
    ("invalid_argument", "quota_exceeded", "no_capacity", "hypervisor_error"),
    VolumeNewIn, VolumeOut)

VOLUME_LIST = ToolContract(
    "rift_volume_list", "List your volumes",
    "List your volumes, oldest first, with their sizes and the VMs they are attached to.",
    ("invalid_argument",), VolumeListIn, VolumeListOut, read_only=True, idempotent=True)

VOLUME_GET = ToolContract(
    "rift_volume_get", "Read a volume",
    "Read one volume of yours, with the VMs it is attached to.",
    ("volume_not_found", "invalid_argument"), VolumeIdIn, VolumeOut, read_only=True,
    idempotent=True)

VOLUME_DELETE = ToolContract(
    "rift_volume_delete", "Delete a volume",
    "Delete a volume of yours and all on it; refused while it is attached to a VM.",
    ("volume_not_found", "volume_busy", "invalid_argument", "hypervisor_error"),
    VolumeIdIn, VolumeOut, destructive=True)

VOLUME_RESIZE = ToolContract(
    "rift_volume_resize", "Grow a volume",
    "Grow a volume of yours to size_gib (never shrink it); while no VM holds it. Its file "
    "system grows at its next writable attach.",
    ("volume_not_found", "volume_busy", "quota_exceeded", "invalid_argument",
     "hypervisor_error"), VolumeResizeIn, VolumeOut)

VOLUME_CLONE = ToolContract(
    "rift_volume_clone", "Clone a volume",
    "A new volume of yours named name, holding what volume_id holds now, in constant time "
    "(copy on write: the two go their own ways from here); while no VM writes it. With "
    "snapshot_id: what volume_id held when that snapshot of a VM holding it was taken.",
    ("volume_not_found", "snapshot_not_found", "volume_busy", "quota_exceeded",
     "invalid_argument", "hypervisor_error"), VolumeCloneIn, VolumeOut)

VM_ATTACH_VOLUME = ToolContract(
    "rift_vm_attach_volume", "Attach a volume to a VM",
    "Plug a volume of yours into a running VM of the handle's task and mount it at path "
    "(read_only: mounted read-only). One VM may write a volume at a time, many may read "
    "one nobody writes. Destroying the VM or closing its task detaches it, never deletes "
    "it; pause and sleep keep it attached.",
    (*HELD, "vm_not_found", "vm_not_running", "volume_not_found", "volume_busy",
     "invalid_argument", "no_capacity", "guest_unreachable", "hypervisor_error"),
    VmAttachVolumeIn, VmOut, slow=True)

VM_DETACH_VOLUME = ToolContract(
    "rift_vm_detach_volume", "Detach a volume from a VM",
    "Unmount a volume from a VM of the handle's task (what is cached is written first) "
    "and unplug it; the volume and all on it stay. One not attached changes nothing.",
    (*HELD, "vm_not_found", "vm_not_running", "volume_not_found", "invalid_argument",
     "guest_unreachable", "hypervisor_error"), VmDetachVolumeIn, VmOut, destructive=True,
    idempotent=True, slow=True)
