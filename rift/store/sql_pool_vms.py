"""Pooled VMs in SQL (``tx.pool_vms``): each pool's VMs, a change (rift.domain.pools'
`PoolVm` transitions) saved by compare-and-set on its state, the delete that hands
one VM to one caller, and what they hold on hosts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, delete, func, select

from rift.domain.pools import POOL_RUNNING_STATES, PoolVm, PoolVmState
from rift.domain.records import HostUsage
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import POOL_VM_COLUMNS, pool_vms, pools


def _vm_of(row: Row[Any]) -> PoolVm:
    return PoolVm(*tuple(row))  # selected with POOL_VM_COLUMNS: the fields' order


class SqlPoolVms(SqlRepository):
    name = "pool_vms"

    def add(self, vm: PoolVm) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            if self.get(vm.id) is not None:
                return DuplicateKey("pool_vms", "id")
            if not self._exists(pools, pools.c.id == vm.pool_id):
                return MissingReference("pool_vms", "pool_id")
            return None

        self._insert(pool_vms, dataclasses.asdict(vm), diagnose)

    def get(self, vm_id: str, *, lock: bool = False) -> PoolVm | None:
        query = select(*POOL_VM_COLUMNS).where(pool_vms.c.id == vm_id)
        if lock and self._writable:
            query = query.with_for_update()
        row = self._conn.execute(query).first()
        return None if row is None else _vm_of(row)

    def all(self, pool_id: str | None = None) -> list[PoolVm]:
        query = select(*POOL_VM_COLUMNS).order_by(pool_vms.c.created_at, pool_vms.c.id)
        if pool_id is not None:
            query = query.where(pool_vms.c.pool_id == pool_id)
        return [_vm_of(row) for row in self._conn.execute(query)]

    def ids(self) -> set[str]:
        return set(self._conn.scalars(select(pool_vms.c.id)))

    def candidates(self, image: str, vcpus: int, memory_mib: int,
                   states: Sequence[PoolVmState]) -> list[PoolVm]:
        query = (select(*POOL_VM_COLUMNS)
                 .where(pool_vms.c.image == image, pool_vms.c.state.in_(states),
                        pool_vms.c.vcpus == vcpus, pool_vms.c.memory_mib == memory_mib)
                 .order_by(pool_vms.c.created_at, pool_vms.c.id))
        return [_vm_of(row) for row in self._conn.execute(query)]

    def save(self, vm: PoolVm, was: PoolVm) -> bool:
        """What the transition from ``was`` changed, while the row is still in
        ``was``'s state."""
        return self._save(pool_vms, vm, was, ("state",))

    def take(self, vm: PoolVm) -> bool:
        self._writing("take")
        statement = delete(pool_vms).where(pool_vms.c.id == vm.id,
                                           pool_vms.c.state == vm.state)
        return self._conn.execute(statement).rowcount == 1

    def usage_by_host(self) -> dict[str, HostUsage]:
        query = (
            select(pool_vms.c.host, func.coalesce(func.sum(pool_vms.c.vcpus), 0),
                   func.coalesce(func.sum(pool_vms.c.memory_mib), 0), func.count())
            .where(pool_vms.c.state.in_(POOL_RUNNING_STATES))
            .group_by(pool_vms.c.host)
        )
        return {
            host: HostUsage(vcpus=int(vcpus), memory_mib=int(memory), vms=int(count))
            for host, vcpus, memory, count in self._conn.execute(query)
        }
