"""Volumes in SQL (``tx.volumes``): one row per volume, its state changed by
compare-and-set, and one row per attachment of a volume to a VM."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, delete, func, select

from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.domain.volumes import Attachment, Volume
from rift.store.sql_base import SqlRepository
from rift.store.tables import (
    ATTACHMENT_COLUMNS,
    VOLUME_COLUMNS,
    vms,
    volume_attachments,
    volumes,
)

_att = volume_attachments


def _volume_of(row: Row[Any]) -> Volume:
    return Volume(*tuple(row))  # selected with VOLUME_COLUMNS: the fields' order


def _attachment_of(row: Row[Any]) -> Attachment:
    return Attachment(*tuple(row))


class SqlVolumes(SqlRepository):
    name = "volumes"

    def add(self, volume: Volume) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            if self.get(volume.id) is not None:
                return DuplicateKey("volumes", "id")
            return DuplicateKey("volumes", "name")

        self._insert(volumes, dataclasses.asdict(volume), diagnose)

    def get(self, volume_id: str, *, lock: bool = False) -> Volume | None:
        query = select(*VOLUME_COLUMNS).where(volumes.c.id == volume_id)
        if lock and self._writable:
            query = query.with_for_update()
        row = self._conn.execute(query).first()
        return None if row is None else _volume_of(row)

    def of_owner(self, owner: str) -> list[Volume]:
        query = (select(*VOLUME_COLUMNS).where(volumes.c.owner == owner)
                 .order_by(volumes.c.created_at, volumes.c.id))
        return [_volume_of(row) for row in self._conn.execute(query)]

    def on_host(self, host: str) -> list[Volume]:
        query = (select(*VOLUME_COLUMNS).where(volumes.c.host == host)
                 .order_by(volumes.c.created_at, volumes.c.id))
        return [_volume_of(row) for row in self._conn.execute(query)]

    def gib_of_owner(self, owner: str) -> int:
        query = select(func.coalesce(func.sum(volumes.c.size_gib), 0)).where(
            volumes.c.owner == owner)
        return int(self._conn.scalar(query) or 0)

    def save(self, volume: Volume, was: Volume) -> bool:
        return self._save(volumes, volume, was, ["state"])

    def record_used(self, volume_id: str, used_bytes: int) -> bool:
        self._writing("record_used")
        return self._conn.execute(volumes.update().where(
            volumes.c.id == volume_id, volumes.c.state == "ready").values(
            used_bytes=used_bytes)).rowcount == 1

    def remove(self, volume: Volume) -> bool:
        self._writing("remove")
        done = self._conn.execute(delete(volumes).where(
            volumes.c.id == volume.id, volumes.c.state == volume.state))
        return done.rowcount == 1

    # attachments

    def attach(self, attachment: Attachment) -> None:
        self._writing("attach")

        def diagnose() -> StoreError | None:
            if not self._exists(vms, vms.c.id == attachment.vm_id):
                return MissingReference("volume_attachments", "vm_id")
            if not self._exists(volumes, volumes.c.id == attachment.volume_id):
                return MissingReference("volume_attachments", "volume_id")
            return DuplicateKey("volume_attachments", "volume_id")

        self._insert(_att, dataclasses.asdict(attachment), diagnose)

    def holders(self, volume_id: str) -> list[Attachment]:
        query = (select(*ATTACHMENT_COLUMNS).where(_att.c.volume_id == volume_id)
                 .order_by(_att.c.created_at, _att.c.vm_id))
        return [_attachment_of(row) for row in self._conn.execute(query)]

    def of_vms(self, vm_ids: Sequence[str]) -> dict[str, list[Attachment]]:
        found: dict[str, list[Attachment]] = {vm_id: [] for vm_id in vm_ids}
        if not found:
            return found
        query = (select(*ATTACHMENT_COLUMNS).where(_att.c.vm_id.in_(list(found)))
                 .order_by(_att.c.target))
        for row in self._conn.execute(query):
            attachment = _attachment_of(row)
            found[attachment.vm_id].append(attachment)
        return found

    def unsettled(self) -> list[Attachment]:
        query = (select(*ATTACHMENT_COLUMNS).where(_att.c.state != "attached")
                 .order_by(_att.c.created_at, _att.c.vm_id))
        return [_attachment_of(row) for row in self._conn.execute(query)]

    def save_attachment(self, attachment: Attachment, was: Attachment) -> bool:
        self._writing("save_attachment")
        return self._conn.execute(_att.update().where(
            _att.c.volume_id == was.volume_id, _att.c.vm_id == was.vm_id,
            _att.c.state == was.state).values(state=attachment.state)).rowcount == 1

    def detach(self, vm_id: str, volume_id: str | None = None) -> list[Attachment]:
        self._writing("detach")
        where = [_att.c.vm_id == vm_id]
        if volume_id is not None:
            where.append(_att.c.volume_id == volume_id)
        gone = [_attachment_of(row) for row in
                self._conn.execute(select(*ATTACHMENT_COLUMNS).where(*where))]
        if gone:
            self._conn.execute(delete(_att).where(*where))
        return gone
