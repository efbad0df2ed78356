"""Pools in SQL (``tx.pools``): the pools operators asked for and their VMs, the
compare-and-set that hands one VM to one caller, and what they hold on hosts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, func, or_, select, update

from rift.domain.records import POOL_RUNNING_STATES, HostUsage, Pool, PoolVm, PoolVmState
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.changes import POOL_CHANGEABLE, changed, check_changes
from rift.store.sql_base import SqlRepository
from rift.store.tables import POOL_COLUMNS, POOL_VM_COLUMNS, pool_vms, pools


def _pool_of(row: Row[Any]) -> Pool:
    return Pool(*tuple(row))  # selected with POOL_COLUMNS: the fields' order


def _vm_of(row: Row[Any]) -> PoolVm:
    return PoolVm(*tuple(row))


class SqlPools(SqlRepository):
    name = "pools"

    # pools

    def add(self, pool: Pool) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            if self.get(pool.id) is not None:
                return DuplicateKey("pools", "id")
            if self.find(pool.image, pool.host, pool.vcpus, pool.memory_mib) is not None:
                return DuplicateKey("pools", "image")
            return None

        self._insert(pools, dataclasses.asdict(pool), diagnose)

    def get(self, pool_id: str) -> Pool | None:
        row = self._conn.execute(select(*POOL_COLUMNS).where(pools.c.id == pool_id)).first()
        return None if row is None else _pool_of(row)

    def find(self, image: str, host: str | None, vcpus: int, memory_mib: int) -> Pool | None:
        same_host = pools.c.host.is_(None) if host is None else pools.c.host == host
        query = select(*POOL_COLUMNS).where(pools.c.image == image, same_host,
                                            pools.c.vcpus == vcpus,
                                            pools.c.memory_mib == memory_mib)
        row = self._conn.execute(query).first()
        return None if row is None else _pool_of(row)

    def all(self) -> list[Pool]:
        query = select(*POOL_COLUMNS).order_by(pools.c.image, pools.c.vcpus,
                                               pools.c.memory_mib, pools.c.host)
        return [_pool_of(row) for row in self._conn.execute(query)]

    def update(self, pool_id: str, **changes: Any) -> bool:
        self._writing("update")
        check_changes("pool", changes, POOL_CHANGEABLE)
        if not changes:
            return self._exists(pools, pools.c.id == pool_id)
        statement = update(pools).where(pools.c.id == pool_id).values(**changes)
        return self._conn.execute(statement).rowcount == 1

    def delete(self, pool_id: str) -> bool:
        self._writing("delete")
        return self._conn.execute(delete(pools).where(pools.c.id == pool_id)).rowcount == 1

    def claim_fill(self, pool_id: str, filler: str, now: datetime, until: datetime) -> bool:
        self._writing("claim_fill")
        free = or_(pools.c.filler.is_(None), pools.c.filler == filler, pools.c.fill_until < now)
        statement = (update(pools).where(pools.c.id == pool_id, free)
                     .values(filler=filler, fill_until=until))
        return self._conn.execute(statement).rowcount == 1

    # pool VMs

    def add_vm(self, vm: PoolVm) -> None:
        self._writing("add_vm")

        def diagnose() -> StoreError | None:
            if self.get_vm(vm.id) is not None:
                return DuplicateKey("pool_vms", "id")
            if self.get(vm.pool_id) is None:
                return MissingReference("pool_vms", "pool_id")
            return None

        self._insert(pool_vms, dataclasses.asdict(vm), diagnose)

    def get_vm(self, vm_id: str, *, lock: bool = False) -> PoolVm | None:
        query = select(*POOL_VM_COLUMNS).where(pool_vms.c.id == vm_id)
        if lock and self._writable:
            query = query.with_for_update()
        row = self._conn.execute(query).first()
        return None if row is None else _vm_of(row)

    def vms(self, pool_id: str | None = None) -> list[PoolVm]:
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

    def save_vm(self, vm: PoolVm, was: PoolVm) -> bool:
        """One conditional UPDATE: what the transition from ``was`` changed, while
        the row is still in ``was``'s state."""
        self._writing("save_vm")
        changes = changed(vm, was)
        where = (pool_vms.c.id == was.id, pool_vms.c.state == was.state)
        if not changes:
            return self._exists(pool_vms, *where)
        statement = update(pool_vms).where(*where).values(**changes)
        return self._conn.execute(statement).rowcount == 1

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
