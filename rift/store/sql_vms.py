"""VMs in SQL (``tx.vms``): inserts, lists, the compare-and-set that saves a
transition (on the status and change it left), the usage sampler's write, host usage."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, and_, bindparam, func, or_, select, update

from rift.domain.model import (
    HOLDING_VM_STATUSES,
    LIVE_VM_STATUSES,
    STARTING_VM_CHANGES,
    Vm,
)
from rift.domain.records import HostUsage
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.changes import changed, check_limit
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

    def count_by_status(self, status: str) -> int:
        query = select(func.count()).select_from(vms).where(vms.c.status == status)
        return int(self._conn.scalar(query) or 0)

    def count_created_since(self, owner: str, since: datetime) -> int:
        query = select(func.count()).select_from(vms).where(
            vms.c.owner == owner, vms.c.created_at >= since
        )
        return int(self._conn.scalar(query) or 0)

    def oldest_created_since(self, owner: str, since: datetime) -> datetime | None:
        query = select(func.min(vms.c.created_at)).where(
            vms.c.owner == owner, vms.c.created_at >= since
        )
        oldest: datetime | None = self._conn.scalar(query)
        return oldest

    def save(self, vm: Vm, was: Vm) -> bool:
        """One conditional UPDATE: what the transition from ``was`` changed, while the
        row is still at ``was``'s status and change. True when this call won."""
        self._writing("save")
        changes = changed(vm, was)
        where = (vms.c.id == was.id, vms.c.status == was.status,
                 vms.c.change.is_(None) if was.change is None else vms.c.change == was.change)
        if not changes:
            return self._exists(vms, *where)
        statement = update(vms).where(*where).values(**changes)
        return self._conn.execute(statement).rowcount == 1

    def record_stats(self, vm_id: str, stats: str) -> bool:
        self._writing("record_stats")
        return self._conn.execute(RECORD_STATS, {"vm_id": vm_id, "stats": stats}).rowcount == 1

    def live_of_closed_tasks(self, limit: int) -> list[Vm]:
        """VMs still creating or running in tasks that have closed: what a
        close that died half-way left for the sweep to destroy."""
        check_limit(limit)
        query = (
            select_vms()
            .join(tasks, tasks.c.id == vms.c.task_id)
            .where(tasks.c.status == "closed", vms.c.status.in_(LIVE_VM_STATUSES))
            .order_by(vms.c.seq)
            .limit(limit)
        )
        return [vm_of(row) for row in self._conn.execute(query)]

    def sleep_candidates(self, default_cutoff: datetime | None, set_cutoff: datetime,
                         limit: int) -> list[Vm]:
        check_limit(limit)
        after = tasks.c.sleep_after_s
        quiet = and_(after > 0, tasks.c.last_activity_at < set_cutoff)
        if default_cutoff is not None:
            quiet = or_(quiet, and_(after.is_(None), tasks.c.last_activity_at < default_cutoff))
        query = (
            select_vms()
            .join(tasks, tasks.c.id == vms.c.task_id)
            .where(tasks.c.status == "open", quiet,
                   vms.c.status == "running", vms.c.change.is_(None))
            .order_by(tasks.c.last_activity_at, vms.c.seq)
            .limit(limit)
        )
        return [vm_of(row) for row in self._conn.execute(query)]

    def live_of_owner(self, owner: str) -> list[Vm]:
        query = select_vms().where(vms.c.owner == owner,
                                   vms.c.status.in_(LIVE_VM_STATUSES))
        return [vm_of(row) for row in self._conn.execute(query)]

    def live_on_host(self, host: str) -> list[Vm]:
        """VMs creating or running on ``host``, for the reconciler and placement."""
        query = (
            select_vms()
            .where(vms.c.status.in_(LIVE_VM_STATUSES), vms.c.host == host)
            .order_by(vms.c.seq)
        )
        return [vm_of(row) for row in self._conn.execute(query)]

    def usage_by_host(self) -> dict[str, HostUsage]:
        query = (
            select(
                vms.c.host,
                func.coalesce(func.sum(vms.c.vcpus), 0),
                func.coalesce(func.sum(vms.c.memory_mib), 0),
                func.count(),
            )
            .where(or_(vms.c.status.in_(HOLDING_VM_STATUSES),
                       vms.c.change.in_(STARTING_VM_CHANGES)))
            .group_by(vms.c.host)
        )
        return {
            host: HostUsage(vcpus=int(vcpus), memory_mib=int(memory), vms=int(count))
            for host, vcpus, memory, count in self._conn.execute(query)
        }
