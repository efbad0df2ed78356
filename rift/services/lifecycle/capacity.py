"""What hosts have room for: their size against what their live VMs and their
pooled VMs hold (a saved pool VM holds only disk), for placement and for pools."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from hypervisor.base import elsewhere
from hypervisor.placement import HostLoad, choose_host, largest_free
from rift.domain.errors import HostDiskFull, NoCapacity
from rift.domain.model import Host
from rift.domain.records import HostUsage
from rift.services.ports import Tx

_NONE = HostUsage(0, 0, 0)


def host_loads(tx: Tx, without: Collection[str] = ()) -> tuple[dict[str, Host], list[HostLoad]]:
    """Every host and its load; the pool VMs whose ids are in `without` are left
    out (a pool being resized counts its own VMs as room)."""
    hosts = {h.name: h for h in tx.hosts.all()}
    vm_use = tx.fleet.usage_by_host()
    pool_use = tx.pool_vms.usage_by_host()
    if without:
        for pvm in tx.pool_vms.all():
            if pvm.id in without and pvm.host in pool_use and pvm.state != "saved":
                held = pool_use[pvm.host]
                pool_use[pvm.host] = HostUsage(held.vcpus - pvm.vcpus,
                                               held.memory_mib - pvm.memory_mib, held.vms - 1)
    loads = []
    for h in hosts.values():
        used = vm_use.get(h.name, _NONE)
        pooled = pool_use.get(h.name, _NONE)
        loads.append(HostLoad(h.name, h.vcpus, h.memory_mib, used.vcpus + pooled.vcpus,
                              used.memory_mib + pooled.memory_mib,
                              h.drained or h.unreachable_since is not None))
    return hosts, loads


@dataclass(frozen=True)
class Where:
    """Which hosts a new VM may go to: with `here_only`, one on this machine (a guest
    with an egress allowlist reaches the networks through the egress proxy of the
    `rift serve` beside it); with `host`, that one (its volumes', SPEC §18)."""

    here_only: bool = False
    host: str | None = None


def place(tx: Tx, vcpus: int, memory_mib: int, where: Where = Where(),
          low_disk: Mapping[str, int] | None = None) -> Host:
    """The host a new VM of that size goes to, among those `where` allows, leaving
    out the hosts in `low_disk` (name: free bytes, under their floor); NoCapacity
    with the largest room left when none fits, HostDiskFull when only disk is short."""
    hosts, loads = host_loads(tx)
    if where.here_only:
        loads = [load for load in loads if not elsewhere(hosts[load.name].uri)]
    if where.host is not None:
        loads = [load for load in loads if load.name == where.host]
    low = low_disk or {}
    chosen = choose_host([load for load in loads if load.name not in low], vcpus, memory_mib)
    if chosen is None:
        short = choose_host(loads, vcpus, memory_mib)
        if short is not None:
            raise HostDiskFull(short.name, low[short.name])
        free_vcpus, free_mem = largest_free(loads)
        raise NoCapacity(vcpus, memory_mib, free_vcpus, free_mem)
    return hosts[chosen.name]


def room(load: HostLoad, vcpus: int, memory_mib: int) -> int:
    """How many more VMs of that size fit on the host (0 when it is drained)."""
    if load.drained:
        return 0
    return min(load.free_vcpus // max(1, vcpus), load.free_memory_mib // max(1, memory_mib))
