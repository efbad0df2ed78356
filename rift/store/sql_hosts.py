"""Hosts in SQL (``tx.hosts``): libvirt connections and their capacity."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Row, delete, select, update

from rift.domain.model import Host
from rift.domain.store_errors import DuplicateKey, StoreError
from rift.store.changes import HOST_CHANGEABLE, check_changes
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

    def get(self, name: str) -> Host | None:
        row = self._conn.execute(select(hosts).where(hosts.c.name == name)).first()
        return None if row is None else _host_of(row)

    def all(self) -> list[Host]:
        return [_host_of(row) for row in self._conn.execute(select(hosts).order_by(hosts.c.name))]

    def update(self, name: str, **changes: Any) -> bool:
        self._writing("update")
        check_changes("host", changes, HOST_CHANGEABLE)
        if not changes:
            return self._exists(hosts, hosts.c.name == name)
        statement = update(hosts).where(hosts.c.name == name).values(**changes)
        return self._conn.execute(statement).rowcount == 1

    def delete(self, name: str) -> bool:
        self._writing("delete")
        return self._conn.execute(delete(hosts).where(hosts.c.name == name)).rowcount == 1
