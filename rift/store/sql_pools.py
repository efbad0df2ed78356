"""Pools in SQL (``tx.pools``): the pools operators asked for, how their filling
goes, a change (rift.domain.pools' `Pool` transitions) saved by compare-and-set.
Their VMs are ``tx.pool_vms`` (sql_pool_vms.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Row, delete, select

from rift.domain.pools import Pool
from rift.domain.store_errors import DuplicateKey, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import POOL_COLUMNS, pools


def _pool_of(row: Row[Any]) -> Pool:
    return Pool(*tuple(row))  # selected with POOL_COLUMNS: the fields' order


class SqlPools(SqlRepository):
    name = "pools"

    def add(self, pool: Pool) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            if self.get(pool.id) is not None:
                return DuplicateKey("pools", "id")
            if self.find(pool.image, pool.host, pool.vcpus, pool.memory_mib) is not None:
                return DuplicateKey("pools", "image")
            return None

        self._insert(pools, dataclasses.asdict(pool), diagnose)

    def get(self, pool_id: str, *, lock: bool = False) -> Pool | None:
        query = select(*POOL_COLUMNS).where(pools.c.id == pool_id)
        if lock and self._writable:
            query = query.with_for_update()
        row = self._conn.execute(query).first()
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

    def save(self, pool: Pool, was: Pool) -> bool:
        """What the transition from ``was`` changed, where each column it changes is
        still as in ``was`` (a fill's claim: no other filler took it meanwhile)."""
        return self._save(pools, pool, was, None)

    def delete(self, pool_id: str) -> bool:
        self._writing("delete")
        return self._conn.execute(delete(pools).where(pools.c.id == pool_id)).rowcount == 1
