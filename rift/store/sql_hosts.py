"""Hosts in SQL (``tx.hosts``): libvirt connections and their capacity, a change
(rift.domain.model's `Host` transitions) saved by compare-and-set."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Row, delete, select

from rift.domain.model import Host
from rift.domain.store_errors import DuplicateKey, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import hosts


def _host_of(row: Row[Any]) -> Host:
    return Host(**row._asdict())


class SqlHosts(SqlRepository):
    name = "hosts"

    def add(self, host: Host) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            return DuplicateKey("hosts", "name") if self.get(host.name) else None

        self._insert(hosts, dataclasses.asdict(host), diagnose)

    def get(self, name: str, *, lock: bool = False) -> Host | None:
        query = select(hosts).where(hosts.c.name == name)
        if lock and self._writable:
            query = query.with_for_update()
        row = self._conn.execute(query).first()
        return None if row is None else _host_of(row)

    def all(self) -> list[Host]:
        return [_host_of(row) for row in self._conn.execute(select(hosts).order_by(hosts.c.name))]

    def save(self, host: Host, was: Host) -> bool:
        """What the transition from ``was`` changed, where each column it changes is
        still as in ``was``."""
        return self._save(hosts, host, was, None, key="name")

    def delete(self, name: str) -> bool:
        self._writing("delete")
        return self._conn.execute(delete(hosts).where(hosts.c.name == name)).rowcount == 1
