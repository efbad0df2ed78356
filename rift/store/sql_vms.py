"""VMs in SQL (``tx.vms``): inserts, a task's VMs, the compare-and-set that saves a
transition (on the status and change it left), the usage sampler's write. Reads
across tasks are ``tx.fleet`` (sql_fleet.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, Select, bindparam, func, select, update

from rift.domain.model import (
    LIVE_VM_STATUSES,
    Vm,
)
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import VM_COLUMNS, tasks, vms


def vm_of(row: Row[Any]) -> Vm:
    return Vm(*tuple(row))  # selected with VM_COLUMNS: the fields' order


def select_vms() -> Select[Any]:
    return select(*VM_COLUMNS)


# Built once with bind parameters: every VM call and every task view reads these.
GET_VM = select_vms().where(vms.c.id == bindparam("vm_id"))
GET_VM_FOR_UPDATE = GET_VM.with_for_update()
RECORD_STATS = (update(vms).where(vms.c.id == bindparam("vm_id"), vms.c.status == "running")
                .values(stats=bindparam("stats", type_=vms.c.stats.type)))
VMS_OF_TASK = select_vms().where(vms.c.task_id == bindparam("task_id")).order_by(vms.c.seq)


class SqlVms(SqlRepository):
    name = "vms"

    def add(self, vm: Vm) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            key = vm.idempotency_key
            if key is not None and self.find_by_key(vm.owner, key) is not None:
                return DuplicateKey("vms", "idempotency_key")
            if self._exists(vms, vms.c.id == vm.id):
                return DuplicateKey("vms", "id")
            if not self._exists(tasks, tasks.c.id == vm.task_id):
                return MissingReference("vms", "task_id")
            return None

        self._insert(vms, dataclasses.asdict(vm), diagnose)

    def get(self, vm_id: str, *, lock: bool = False) -> Vm | None:
        statement = GET_VM_FOR_UPDATE if lock and self._writable else GET_VM
        row = self._conn.execute(statement, {"vm_id": vm_id}).first()
        return None if row is None else vm_of(row)

    def find_by_key(self, owner: str, key: str) -> Vm | None:
        query = select_vms().where(vms.c.owner == owner, vms.c.idempotency_key == key)
        row = self._conn.execute(query).first()
        return None if row is None else vm_of(row)

    def of_task(self, task_id: str) -> list[Vm]:
        return [vm_of(row) for row in self._conn.execute(VMS_OF_TASK, {"task_id": task_id})]

    def of_tasks(self, task_ids: Sequence[str]) -> dict[str, list[Vm]]:
        """Every asked task id is a key (with ``[]`` when it has no VMs)."""
        found: dict[str, list[Vm]] = {task_id: [] for task_id in task_ids}
        if not found:
            return found
        query = select_vms().where(vms.c.task_id.in_(list(found))).order_by(vms.c.seq)
        for row in self._conn.execute(query):
            vm = vm_of(row)
            found[vm.task_id].append(vm)
        return found

    def count_live(self, task_id: str) -> int:
        query = select(func.count()).select_from(vms).where(
            vms.c.task_id == task_id, vms.c.status.in_(LIVE_VM_STATUSES)
        )
        return int(self._conn.scalar(query) or 0)

    def save(self, vm: Vm, was: Vm) -> bool:
        """What the transition from ``was`` changed, while the row is still at
        ``was``'s status and change. True when this call won."""
        return self._save(vms, vm, was, ("status", "change"))

    def record_stats(self, vm_id: str, stats: str) -> bool:
        self._writing("record_stats")
        return self._conn.execute(RECORD_STATS, {"vm_id": vm_id, "stats": stats}).rowcount == 1
