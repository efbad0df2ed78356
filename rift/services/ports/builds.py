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


class BuildGuest(Protocol):
    """The VM a build runs its steps in (rift.services.builds.guest over the VM,
    exec, file and snapshot use cases; a fake in unit tests)."""

    def start(self, image: str) -> None:
        """A VM of `image` (a layer, or the recipe's FROM), running; the one before goes."""
        ...
    def run(self, script: str, timeout_s: int) -> tuple[int | None, str]:
        """Run a shell script to its end: its exit code (None: killed or timed out)
        and the tail of its output."""
        ...
    def put(self, path: str, data: bytes) -> None: ...
    def answers(self, port: int) -> bool:
        """Whether something in the guest accepts a connection on `port`."""
        ...
    def save_layer(self, name: str, *, last: bool = False) -> None:
        """The VM as it is now (memory and disk) becomes the hidden image `name`;
        the VM runs on, unless this is the build's `last` layer (then it stops)."""
        ...
    def close(self) -> None: ...


class LayerFiles(Protocol):
    """The files of layers and built images in the images folder."""

    def exists(self, name: str) -> bool: ...
    def identity(self, image: str) -> str:
        """What changes when image `image` is built again (its manifest's digest)."""
        ...
    def image_from(self, layer: str, name: str) -> None:
        """Image `name` (replacing one of that name) as a standalone copy of `layer`."""
        ...
    def remove(self, name: str) -> None: ...
    def backing(self, name: str) -> str | None:
        """The layer (or image) whose disk layer `name`'s disk is an overlay on."""
        ...
    def stray(self) -> list[str]:
        """Every layer's folder there is, whole or half-written (a build cut while it
        saved one), by a name `remove` takes."""
        ...
