"""The task, VM and event views of SPEC §3, as plain JSON-ready dicts."""

from __future__ import annotations

from typing import Any

from rift.domain.clock import iso
from rift.domain.leases import Clocks
from rift.domain.model import Event, Task, Vm


def vm_view(vm: Vm) -> dict[str, Any]:
    reachable = vm.status == "running" and vm.ssh_port is not None
    ssh = {"host": vm.ssh_host, "port": vm.ssh_port} if reachable else None
    return {
        "id": vm.id,
        "task_id": vm.task_id,
        "name": vm.name,
        "image": vm.image,
        "status": vm.status,
        "host": vm.host,
        "vcpus": vm.vcpus,
        "memory_mib": vm.memory_mib,
        "ssh": ssh,
        "created_at": iso(vm.created_at),
        "ready_at": iso(vm.ready_at),
        "destroyed_at": iso(vm.destroyed_at),
        "error": vm.error,
    }


def task_view(task: Task, vms: list[Vm], clocks: Clocks) -> dict[str, Any]:
    return {
        "id": task.id,
        "name": task.name,
        "owner": task.owner,
        "status": task.status,
        "holder": task.holder if task.is_held else None,
        "held_since": iso(task.held_since) if task.is_held else None,
        "last_activity_at": iso(task.last_activity_at),
        "lease_quiet_at": iso(clocks.lease_quiet_at(task)) if task.is_held else None,
        "closes_at": iso(clocks.closes_at(task)),
        "created_at": iso(task.created_at),
        "closed_at": iso(task.closed_at),
        "close_reason": task.close_reason,
        "vms": [vm_view(vm) for vm in vms],
    }


def event_view(event: Event) -> dict[str, Any]:
    return {
        "id": event.id,
        "type": event.type,
        "at": iso(event.at),
        "actor": event.actor,
        "details": event.details,
    }
