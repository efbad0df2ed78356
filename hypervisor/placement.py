"""Choosing a host: the one with the most free memory that fits, never a drained one.

Pure: the caller supplies each host's size and what its live VMs use (libvirt's
test driver checks no capacity, so Rift keeps its own accounts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HostLoad:
    name: str
    vcpus: int
    memory_mib: int
    used_vcpus: int
    used_memory_mib: int
    drained: bool

    @property
    def free_vcpus(self) -> int:
        return max(0, self.vcpus - self.used_vcpus)

    @property
    def free_memory_mib(self) -> int:
        return max(0, self.memory_mib - self.used_memory_mib)


def _best_first(hosts: Sequence[HostLoad]) -> list[HostLoad]:
    """Undrained hosts, most free memory first, ties broken by name."""
    return sorted((h for h in hosts if not h.drained), key=lambda h: (-h.free_memory_mib, h.name))


def choose_host(hosts: Sequence[HostLoad], vcpus: int, memory_mib: int) -> HostLoad | None:
    """The undrained host with the most free memory that fits the VM, or None."""
    for host in _best_first(hosts):
        if host.free_vcpus >= vcpus and host.free_memory_mib >= memory_mib:
            return host
    return None


def largest_free(hosts: Sequence[HostLoad]) -> tuple[int, int]:
    """(vCPUs, MiB) free on the undrained host with the most free memory; (0, 0) if none."""
    ranked = _best_first(hosts)
    if not ranked:
        return 0, 0
    return ranked[0].free_vcpus, ranked[0].free_memory_mib
