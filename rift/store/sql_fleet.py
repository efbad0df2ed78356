"""VMs across tasks in SQL (``tx.fleet``): the reads by host, owner or status that
reconciliation, placement, the sweeps, the operator's lists and /metrics make."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, and_, func, or_, select

from rift.domain.model import (
    HOLDING_VM_STATUSES,
    LIVE_VM_STATUSES,
    STARTING_VM_CHANGES,
    Vm,
)
from rift.domain.records import HostUsage
from rift.store.changes import check_limit
from rift.store.sql_base import SqlRepository
from rift.store.tables import VM_COLUMNS, tasks, vms


def vm_of(row: Row[Any]) -> Vm:
    return Vm(*tuple(row))  # selected with VM_COLUMNS: the fields' order


def select_vms() -> Select[Any]:
    return select(*VM_COLUMNS)


class SqlFleet(SqlRepository):
    name = "fleet"

    def count_by_status(self, status: str) -> int:
        query = select(func.count()).select_from(vms).where(vms.c.status == status)
        return int(self._conn.scalar(query) or 0)

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
