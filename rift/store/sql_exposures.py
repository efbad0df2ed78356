"""Exposures in SQL (``tx.exposures``): one row per exposed guest port, found by
its secret's digest; replaced by a new one, deleted when it ends."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, delete, select

from rift.domain.records import Exposure
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import EXPOSURE_COLUMNS, exposures, vms


def _exposure_of(row: Row[Any]) -> Exposure:
    return Exposure(*tuple(row))  # selected with EXPOSURE_COLUMNS: the fields' order


class SqlExposures(SqlRepository):
    name = "exposures"

    def put(self, exposure: Exposure) -> Exposure | None:
        self._writing("put")
        old = self._conn.execute(select(*EXPOSURE_COLUMNS).where(
            exposures.c.vm_id == exposure.vm_id, exposures.c.port == exposure.port)).first()
        if old is not None:
            self._conn.execute(delete(exposures).where(exposures.c.id == old.id))

        def diagnose() -> StoreError | None:
            if not self._exists(vms, vms.c.id == exposure.vm_id):
                return MissingReference("exposures", "vm_id")
            return DuplicateKey("exposures", "digest")

        self._insert(exposures, dataclasses.asdict(exposure), diagnose)
        return None if old is None else _exposure_of(old)

    def by_digest(self, digest: str) -> Exposure | None:
        row = self._conn.execute(select(*EXPOSURE_COLUMNS)
                                 .where(exposures.c.digest == digest)).first()
        return None if row is None else _exposure_of(row)

    def of_vms(self, vm_ids: Sequence[str]) -> dict[str, list[Exposure]]:
        found: dict[str, list[Exposure]] = {vm_id: [] for vm_id in vm_ids}
        if not found:
            return found
        query = (select(*EXPOSURE_COLUMNS).where(exposures.c.vm_id.in_(list(found)))
                 .order_by(exposures.c.port))
        for row in self._conn.execute(query):
            exposure = _exposure_of(row)
            found[exposure.vm_id].append(exposure)
        return found

    def remove(self, vm_id: str, port: int | None = None) -> list[Exposure]:
        self._writing("remove")
        where = [exposures.c.vm_id == vm_id]
        if port is not None:
            where.append(exposures.c.port == port)
        gone = [_exposure_of(row) for row in
                self._conn.execute(select(*EXPOSURE_COLUMNS).where(*where))]
        if gone:
            self._conn.execute(delete(exposures).where(*where))
        return gone

    def all(self) -> list[Exposure]:
        query = select(*EXPOSURE_COLUMNS).order_by(exposures.c.created_at, exposures.c.id)
        return [_exposure_of(row) for row in self._conn.execute(query)]
