"""The host ports: a hypervisor connection per host, and the files a domain needs
on a host elsewhere (called by starts, moves, snapshots and teardown)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hypervisor.base import DomainSpec, Hypervisor


class HostPool(Protocol):
    """Opens (and caches) a hypervisor connection per host URI."""

    def hypervisor(self, uri: str) -> Hypervisor: ...
    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Overlay:
    """An empty qcow2 overlay of `base` at `path`, of `size_bytes` (a VM moving)."""

    base: str
    path: str
    size_bytes: int


class HostFiles(Protocol):
    """Puts a domain's files on its host before it starts there, when that host is
    elsewhere (rift.guest.host_files.RemoteFiles); HypervisorError(op="prepare") else.
    Without SSH to hosts (rift.services.absent.NoHostFiles) nothing is put there,
    and a VM cannot move to a host elsewhere."""

    def prepare(self, uri: str, spec: DomainSpec) -> None: ...
    def receive(self, uri: str, spec: DomainSpec, overlay: Overlay | None) -> None:
        """What a VM moving live to the host elsewhere at `uri` reads from its disk:
        `spec`'s files, and `overlay` made there; HypervisorError (op "migrate"
        without SSH to hosts, "prepare" when they cannot be put there)."""
        ...

    def forget(self, uri: str, vm_id: str) -> None:
        """Best effort: the VM's own files on its host (a host elsewhere) go."""
        ...
