"""Builds and the images they made in SQL (``tx.builds``, ``tx.owned_images``):
a build's row changes by compare-and-set on its state; an image's row says whose
it is and whether it is published."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Row, delete, select

from rift.domain.builds import Build, OwnedImage
from rift.domain.store_errors import DuplicateKey, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import BUILD_COLUMNS, OWNED_IMAGE_COLUMNS, builds, owned_images


def _build_of(row: Row[Any]) -> Build:
    return Build(*tuple(row))  # selected with BUILD_COLUMNS: the fields' order


def _image_of(row: Row[Any]) -> OwnedImage:
    return OwnedImage(*tuple(row))


class SqlBuilds(SqlRepository):
    name = "builds"

    def add(self, build: Build) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            return DuplicateKey("builds", "id") if self.get(build.id) is not None else None

        self._insert(builds, dataclasses.asdict(build), diagnose)

    def get(self, build_id: str) -> Build | None:
        row = self._conn.execute(select(*BUILD_COLUMNS).where(builds.c.id == build_id)).first()
        return None if row is None else _build_of(row)

    def of_owner(self, owner: str, limit: int = 50) -> list[Build]:
        query = (select(*BUILD_COLUMNS).where(builds.c.owner == owner)
                 .order_by(builds.c.created_at.desc(), builds.c.id).limit(limit))
        return [_build_of(row) for row in self._conn.execute(query)]

    def running(self) -> list[Build]:
        query = (select(*BUILD_COLUMNS).where(builds.c.state == "running")
                 .order_by(builds.c.created_at, builds.c.id))
        return [_build_of(row) for row in self._conn.execute(query)]

    def save(self, build: Build, was: Build) -> bool:
        return self._save(builds, build, was, ("state",))


class SqlOwnedImages(SqlRepository):
    name = "owned_images"

    def add(self, image: OwnedImage) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            return (DuplicateKey("owned_images", "name")
                    if self.get(image.name) is not None else None)

        self._insert(owned_images, dataclasses.asdict(image), diagnose)

    def get(self, name: str) -> OwnedImage | None:
        row = self._conn.execute(select(*OWNED_IMAGE_COLUMNS)
                                 .where(owned_images.c.name == name)).first()
        return None if row is None else _image_of(row)

    def all(self) -> list[OwnedImage]:
        query = select(*OWNED_IMAGE_COLUMNS).order_by(owned_images.c.name)
        return [_image_of(row) for row in self._conn.execute(query)]

    def save(self, image: OwnedImage, was: OwnedImage) -> bool:
        return self._save(owned_images, image, was, None, key="name")

    def remove(self, name: str) -> bool:
        self._writing("remove")
        statement = delete(owned_images).where(owned_images.c.name == name)
        return self._conn.execute(statement).rowcount == 1
