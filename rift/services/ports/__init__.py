"""The engine's ports. Each has a real adapter and a fake beside it, except the
store: it is SQL (SQLite or PostgreSQL), and the engine's tests run on a real
SQLite file.

The store is reached through a unit of work: ``with store.write() as tx:``
runs one transaction (state change and its event row commit together or not
at all); ``with store.read() as tx:`` reads a consistent snapshot. The rows are
reached through small repositories on it (rift/services/ports/repositories.py).

The guest ports are in rift/services/ports/guest.py (files, execs, keys, the
connection's life), the host ports in rift/services/ports/hosts.py; they are
re-exported here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from rift.services.ports.builds import BuildRepository, OwnedImageRepository
from rift.services.ports.code_contexts import CodeContextRepository
from rift.services.ports.guest import (
    ExecGone,
    ExecRead,
    ExecStart,
    GuestExec,
    GuestExecs,
    GuestFiles,
    GuestKeys,
    GuestLifecycle,
    Guests,
    PortChannel,
    PortClosed,
    WokenBy,
)
from rift.services.ports.hosts import HostFiles, HostPool, Overlay
from rift.services.ports.repositories import (
    EventRepository,
    ExecRepository,
    ExposureRepository,
    FleetReads,
    HostRepository,
    MetaRepository,
    PoolRepository,
    PoolVmRepository,
    RateWindows,
    SandboxRepository,
    SnapshotRepository,
    TaskRepository,
    TokenRepository,
    UserRepository,
    VmRepository,
    WebRepository,
)
from rift.services.ports.volumes import GuestMounts, VolumeFiles, VolumeRepository

__all__ = [
    "ExecGone",
    "ExecRead",
    "ExecStart",
    "GuestExec",
    "GuestExecs",
    "GuestFiles",
    "GuestKeys",
    "GuestLifecycle",
    "GuestMounts",
    "Guests",
    "HostFiles",
    "HostPool",
    "ImageCatalog",
    "Overlay",
    "PortChannel",
    "PortClosed",
    "Store",
    "Tx",
    "VolumeFiles",
    "VolumeRepository",
    "WokenBy",
]


class Tx(Protocol):
    """One transaction against the store (the unit of work), and the repositories
    it reaches the rows through: ``tx.tasks.get(task_id)``, ``tx.events.add(e)``."""

    @property
    def tasks(self) -> TaskRepository: ...
    @property
    def vms(self) -> VmRepository: ...
    @property
    def fleet(self) -> FleetReads: ...
    @property
    def events(self) -> EventRepository: ...
    @property
    def rates(self) -> RateWindows: ...
    @property
    def users(self) -> UserRepository: ...
    @property
    def tokens(self) -> TokenRepository: ...
    @property
    def hosts(self) -> HostRepository: ...
    @property
    def meta(self) -> MetaRepository: ...
    @property
    def web(self) -> WebRepository: ...
    @property
    def pools(self) -> PoolRepository: ...
    @property
    def pool_vms(self) -> PoolVmRepository: ...
    @property
    def execs(self) -> ExecRepository: ...
    @property
    def snapshots(self) -> SnapshotRepository: ...
    @property
    def exposures(self) -> ExposureRepository: ...
    @property
    def sandboxes(self) -> SandboxRepository: ...
    @property
    def volumes(self) -> VolumeRepository: ...
    @property
    def builds(self) -> BuildRepository: ...
    @property
    def owned_images(self) -> OwnedImageRepository: ...
    @property
    def code_contexts(self) -> CodeContextRepository: ...


class Store(Protocol):
    def read(self) -> AbstractContextManager[Tx]: ...
    def write(self) -> AbstractContextManager[Tx]: ...
    def close(self) -> None: ...


class ImageCatalog(Protocol):
    """The guest images Rift knows; `tiny` is always among them."""

    def names(self) -> list[str]: ...
    def fixed_sizes(self, name: str) -> tuple[int, int, int] | None:
        """(vCPUs, memory MiB, disk GiB) that every VM of `name` has (an image made
        from a snapshot: its saved state has them), or None when VMs choose."""
        ...
