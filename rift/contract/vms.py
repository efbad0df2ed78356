"""The VMs' own tools: make, read, destroy, pause and resume a VM; their input
models, the VM answer and their contracts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from rift.contract.base import (
    MAX_DISK_GIB,
    HandleText,
    Input,
    Key,
    MemoryMib,
    Name,
    NoNul,
    Output,
    Vcpus,
    VmId,
    Whole,
)
from rift.contract.base import Path as GuestPath
from rift.contract.tasks import TakeoverBody
from rift.contract.tool import HELD, ToolContract
from rift.contract.views import VmView
from rift.domain.egress import MAX_ENTRIES as MAX_EGRESS_ENTRIES
from rift.domain.ids import is_volume_id
from rift.domain.model import DEFAULT_DISK_GIB

MAX_START_VOLUMES = 8  # PCIe root ports a guest has for volumes at most (domain_xml)


class EgressAllow(Input):
    allow: Annotated[list[Annotated[str, Field(min_length=1, max_length=255)]], Field(
        min_length=1, max_length=MAX_EGRESS_ENTRIES, description=(
            "Names (pypi.org), wildcards (*.github.com: the names below github.com) and "
            "CIDRs (10.0.0.0/8) the guest may reach; at most 64."))]


def _volume_id(value: str) -> str:
    if not is_volume_id(value):
        raise PydanticCustomError("volume_id", "a volume id is vol_ and 8 lowercase base32 "
                                  "characters")
    return value


VolumeId = Annotated[str, AfterValidator(_volume_id), Field(
    description="A volume id (`vol_` + 8 characters), from rift_volume_new.",
    json_schema_extra={"pattern": "^vol_[a-z2-7]{8}$"})]


class AttachBody(Input):
    volume_id: VolumeId
    path: Annotated[GuestPath, Field(description=(
        "Where the guest mounts it: absolute, not /, not under /proc, /sys, /dev, /boot, "
        "/usr or /etc (made when missing)."))]
    read_only: Annotated[bool, Field(description=(
        "Mounted read-only: many VMs may read a volume that no VM writes."))] = False


class VmNewBody(Input):
    name: Name | None = None
    image: Annotated[str, Field(min_length=1, max_length=200, description=(
        "The guest image (default: the operator's RIFT_DEFAULT_IMAGE).")), NoNul] | None = None
    vcpus: Vcpus = 1
    memory_mib: MemoryMib | None = None
    disk_gib: Annotated[int, Field(ge=1, le=MAX_DISK_GIB, description=(
        "Size of the VM's own copy-on-write disk in GiB (sparse; never smaller than the "
        "image's base disk; images without a disk, such as tiny, ignore it)."
    )), Whole] = DEFAULT_DISK_GIB
    egress: Annotated[Literal["open", "none"] | EgressAllow, Field(description=(
        "What the guest may reach: open, the networks beyond its host (default: the "
        "operator's RIFT_DEFAULT_EGRESS); none, nothing off the VM; or {\"allow\": [...]}, "
        "only those names and CIDRs, over HTTP and HTTPS through Rift's proxy (the guest's "
        "http_proxy and https_proxy name it). Whichever, nothing on its host but Rift's own "
        "offers. Enforced outside the guest."))] | None = None
    volumes: Annotated[list[AttachBody], Field(max_length=MAX_START_VOLUMES, description=(
        "Volumes to attach once it runs (each as rift_vm_attach_volume takes it); one that "
        "cannot be attached refuses the call and leaves no VM."))] = []
    idempotency_key: Key | None = None


class VmNewIn(VmNewBody):
    handle: HandleText | None = None


class VmGetIn(Input):
    vm_id: VmId


class VmDestroyIn(TakeoverBody):
    handle: HandleText | None = None
    vm_id: VmId


class VmHeldIn(Input):
    """A VM of the handle's task: what pause and resume take."""

    handle: HandleText | None = None
    vm_id: VmId


class VmOut(Output):
    vm: VmView


VM_NEW = ToolContract(
    "rift_vm_new", "Make a VM",
    "Make a VM in the handle's task; answers once it is running and its guest answers, "
    "or failed.",
    (*HELD, "invalid_argument", "image_not_found", "quota_exceeded", "rate_limited",
     "no_capacity", "idempotency_conflict", "volume_not_found", "volume_busy"), VmNewIn,
    VmOut, idempotent=True, slow=True)


VM_GET = ToolContract(
    "rift_vm_get", "Read a VM", "Read one VM of your tasks.",
    ("invalid_argument", "vm_not_found"), VmGetIn, VmOut, read_only=True, idempotent=True)


VM_DESTROY = ToolContract(
    "rift_vm_destroy", "Destroy a VM",
    "Destroy one VM: with its task's handle, or without one under rift_task_attach's "
    "rules (for VMs an earlier conversation left behind).",
    (*HELD[1:], "task_held", "vm_not_found", "invalid_argument", "hypervisor_error"),
    VmDestroyIn, VmOut, destructive=True, idempotent=True, slow=True)


VM_PAUSE = ToolContract(
    "rift_vm_pause", "Pause a VM",
    "Park a running VM of the handle's task: its memory is saved to disk and it stops, "
    "holding no vCPUs or memory until rift_vm_resume brings it back with its processes, "
    "execs and files as they were (no other call wakes it). Pausing a paused VM answers "
    "it as it is; pausing a sleeping one keeps it asleep, as paused.",
    (*HELD, "vm_not_found", "vm_not_running", "invalid_argument", "hypervisor_error"),
    VmHeldIn, VmOut, idempotent=True, slow=True)


VM_RESUME = ToolContract(
    "rift_vm_resume", "Resume a VM",
    "Bring a paused VM of the handle's task back where it was (on its own host, which "
    "needs room for it), or wake a sleeping one. Resuming a running VM answers it as it "
    "is.",
    (*HELD, "vm_not_found", "vm_not_running", "no_capacity", "guest_unreachable",
     "invalid_argument", "hypervisor_error"), VmHeldIn, VmOut, idempotent=True, slow=True)
