"""VMs in memory: the same answers as ``rift.store.sql_vms``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rift.domain.model import LIVE_VM_STATUSES, Vm, VmStatus
from rift.domain.records import HostUsage
from rift.domain.store_errors import DuplicateKey, MissingReference
from rift.store.changes import VM_CHANGEABLE, check_changes, check_limit, utc
from rift.store.memory_base import MemoryTxBase, utc_changes, utc_values


class MemoryVmQueries(MemoryTxBase):
    def insert_vm(self, vm: Vm) -> None:
        self._writing("insert_vm")
        key = vm.idempotency_key
        if key is not None and self.find_vm_by_key(vm.owner, key) is not None:
            raise DuplicateKey("vms", "idempotency_key")
        if vm.id in self._s.vms:
            raise DuplicateKey("vms", "id")
        if vm.task_id not in self._s.tasks:
            raise MissingReference("vms", "task_id")
        self._s.vms[vm.id] = utc_values(vm)
        self._s.vm_seq[vm.id] = self._next_seq()

    def get_vm(self, vm_id: str) -> Vm | None:
        return self._s.vms.get(vm_id)

    def find_vm_by_key(self, owner: str, key: str) -> Vm | None:
        return next(
            (v for v in self._s.vms.values() if v.owner == owner and v.idempotency_key == key),
            None,
        )

    def _vms_in_order(self) -> list[Vm]:
        return sorted(self._s.vms.values(), key=lambda v: self._s.vm_seq[v.id])

    def list_vms(self, task_id: str) -> list[Vm]:
        return [v for v in self._vms_in_order() if v.task_id == task_id]

    def list_vms_of_tasks(self, task_ids: Sequence[str]) -> dict[str, list[Vm]]:
        found: dict[str, list[Vm]] = {task_id: [] for task_id in task_ids}
        for vm in self._vms_in_order():
            if vm.task_id in found:
                found[vm.task_id].append(vm)
        return found

    def count_live_vms(self, task_id: str) -> int:
        return sum(1 for v in self._s.vms.values() if v.task_id == task_id and v.is_live)

    def count_vms_by_status(self, status: str) -> int:
        return sum(1 for v in self._s.vms.values() if v.status == status)

    def _vms_created_since(self, owner: str, since: datetime) -> list[datetime]:
        since = utc(since)
        return [
            v.created_at for v in self._s.vms.values()
            if v.owner == owner and v.created_at >= since
        ]

    def count_vms_created_since(self, owner: str, since: datetime) -> int:
        return len(self._vms_created_since(owner, since))

    def oldest_vm_created_since(self, owner: str, since: datetime) -> datetime | None:
        return min(self._vms_created_since(owner, since), default=None)

    def update_vm(self, vm_id: str, expected_status: Sequence[VmStatus], **changes: Any) -> bool:
        self._writing("update_vm")
        check_changes("vm", changes, VM_CHANGEABLE)
        vm = self._s.vms.get(vm_id)
        if vm is None or vm.status not in expected_status:
            return False
        self._s.vms[vm_id] = dataclasses.replace(vm, **utc_changes(changes))
        return True

    def live_vms_of_closed_tasks(self, limit: int) -> list[Vm]:
        check_limit(limit)
        closed = {t.id for t in self._s.tasks.values() if t.status == "closed"}
        return [v for v in self._vms_in_order() if v.task_id in closed and v.is_live][:limit]

    def live_vms_on_host(self, host: str) -> list[Vm]:
        return [v for v in self._vms_in_order() if v.host == host and v.is_live]

    def host_usage(self) -> dict[str, HostUsage]:
        usage: dict[str, HostUsage] = {}
        for vm in self._s.vms.values():
            if vm.status in LIVE_VM_STATUSES:
                was = usage.get(vm.host, HostUsage(vcpus=0, memory_mib=0, vms=0))
                usage[vm.host] = HostUsage(
                    vcpus=was.vcpus + vm.vcpus,
                    memory_mib=was.memory_mib + vm.memory_mib,
                    vms=was.vms + 1,
                )
        return usage
