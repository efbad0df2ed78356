"""The store's ports for builds and the images they made (SPEC §19)."""

from __future__ import annotations

from typing import Protocol

from rift.domain.builds import Build, OwnedImage


class BuildRepository(Protocol):
    """Builds: a change is a `Build` transition saved with one compare-and-set on
    the state it left."""

    def add(self, build: Build) -> None: ...
    def get(self, build_id: str) -> Build | None: ...
    def of_owner(self, owner: str, limit: int = 50) -> list[Build]:
        """Newest first."""
        ...
    def running(self) -> list[Build]: ...
    def save(self, build: Build, was: Build) -> bool:
        """Store what ``build`` changed from ``was`` while the row is still in
        ``was.state``. True when this call won."""
        ...


class OwnedImageRepository(Protocol):
    """The images (and hidden layers) builds made: whose, and published or not.
    An image with no row (tiny, debian, an operator's `rift image add`) is everyone's."""

    def add(self, image: OwnedImage) -> None: ...
    def get(self, name: str) -> OwnedImage | None: ...
    def all(self) -> list[OwnedImage]: ...
    def save(self, image: OwnedImage, was: OwnedImage) -> bool:
        """What ``image`` changed from ``was``, while the row still holds those values."""
        ...
    def remove(self, name: str) -> bool: ...
