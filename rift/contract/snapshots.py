"""The snapshots' and forks' tools (SPEC §12): snapshot a VM, delete a snapshot, fork
from a snapshot or a running VM; their input models, answers and contracts."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rift.contract.base import HandleText, Input, Name, Output, SnapshotId, VmId, Whole
from rift.contract.tool import HELD, ToolContract
from rift.contract.views import SnapshotView, VmView


class SnapshotBody(Input):
    name: Name | None = None


class VmSnapshotIn(SnapshotBody):
    handle: HandleText | None = None
    vm_id: VmId


class VmSnapshotDeleteIn(Input):
    handle: HandleText | None = None
    snapshot_id: SnapshotId


class ForkBody(Input):
    name: Name | None = None
    count: Annotated[int, Field(ge=1, le=1024, description=(
        "How many forks (all or none; at most the task's room under "
        "RIFT_MAX_VMS_PER_TASK).")), Whole] = 1


class VmForkIn(ForkBody):
    handle: HandleText | None = None
    snapshot_id: SnapshotId | None = None  # one of the two
    vm_id: VmId | None = None


class SnapshotOut(Output):
    snapshot: SnapshotView


class VmsOut(Output):
    vms: list[VmView]


VM_SNAPSHOT = ToolContract(
    "rift_vm_snapshot", "Snapshot a VM",
    "Keep a running VM's memory and disk as of now, for rift_vm_fork: the VM runs on "
    "after a pause of about a restore. The snapshot belongs to the task (at most "
    "RIFT_MAX_SNAPSHOTS_PER_TASK) and goes when it closes. A sleeping VM is woken first.",
    (*HELD, "vm_not_found", "vm_not_running", "quota_exceeded", "guest_unreachable",
     "no_capacity", "invalid_argument", "hypervisor_error"), VmSnapshotIn, SnapshotOut,
    slow=True)


VM_SNAPSHOT_DELETE = ToolContract(
    "rift_vm_snapshot_delete", "Delete a snapshot",
    "Delete a snapshot of the handle's task and its files.",
    (*HELD, "snapshot_not_found", "invalid_argument"), VmSnapshotDeleteIn, SnapshotOut,
    destructive=True)


VM_FORK = ToolContract(
    "rift_vm_fork", "Fork a VM",
    "Start count new VMs in the handle's task from a snapshot (snapshot_id: this task's, "
    "or another open task's of yours) or from a running VM (vm_id: snapshotted first, "
    "that snapshot deleted after), each with the processes and files it had and an "
    "identity of its own (host key, MAC, clock, entropy, disk). All or none: over the "
    "quota or the host's room, none is made.",
    (*HELD, "snapshot_not_found", "vm_not_found", "vm_not_running", "quota_exceeded",
     "no_capacity", "invalid_argument", "hypervisor_error"), VmForkIn, VmsOut, slow=True)
