"""Pools of ready VMs (SPEC §11): what operators ask for (`rift pool set`, `list`,
`clear`, the `RIFT_DEFAULT_POOL`) and how many pool VMs there are. The filler keeps
them full (`pool_filler.py`); `rift_vm_new` takes a VM from one (`handouts.py`).

A pooled VM is no one's. Its id (`vm_…`) is made when it starts, and names its
domain and files from then on, but no view shows it until it is handed out.
A `running` pool keeps VMs booted (state `ready`); a `saved` pool keeps VMs that
were booted and then saved by libvirt (managed save, state `saved`), restored on
hand-out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rift.contract.base import command
from rift.contract.operator import PoolSetIn
from rift.domain.errors import ImageNotFound, InvalidArgument, PoolDoesNotFit
from rift.domain.ids import new_pool_id
from rift.domain.model import default_memory_mib
from rift.domain.pools import Pool
from rift.services.context import Deps
from rift.services.lifecycle.capacity import host_loads, room
from rift.services.lifecycle.guest_kinds import kind_on
from rift.services.lifecycle.launch import check_image, fixed_sizes
from rift.services.lifecycle.pool_filler import change_pool, destroy_pool_vm
from rift.services.ports import Tx

DEFAULT_VCPUS = 1


@dataclass(frozen=True)
class PoolRow:
    """One line of `rift pool list`."""

    pool: Pool
    running_ready: int
    saved_ready: int

    def as_dict(self) -> dict[str, Any]:
        pool = self.pool
        return {"image": pool.image, "host": pool.host, "vcpus": pool.vcpus,
                "memory_mib": pool.memory_mib,
                "running": {"want": pool.running, "ready": self.running_ready},
                "saved": {"want": pool.saved, "ready": self.saved_ready},
                "last_error": pool.last_error}


def set_pool(deps: Deps, cmd: PoolSetIn) -> Pool:
    """`rift pool set`: create or resize the pool of that image and size (on `host`, or
    any). Refused when the image is not built, the host is not known, its size fits
    no host, or more running VMs than fit."""
    image, host = cmd.image, cmd.host
    vcpus, memory_mib, _ = fixed_sizes(image, deps.images.fixed_sizes(image), cmd.vcpus,
                                       cmd.memory_mib, None)
    vcpus = DEFAULT_VCPUS if vcpus is None else vcpus
    memory_mib = default_memory_mib(image) if memory_mib is None else memory_mib
    now = deps.clock.now()
    with deps.store.write() as tx:
        known = deps.images.names()
        if image not in known:
            raise ImageNotFound(image, sorted(known),
                                hint=f"the operator builds it: rift image build {image}")
        hosts = {h.name: h for h in tx.hosts.all()}
        if host is not None and host not in hosts:
            raise InvalidArgument("host", f"no host {host!r}; rift host list names them")
        for candidate in ([hosts[host]] if host is not None else list(hosts.values())):
            check_image(deps, kind_on(deps, candidate.uri, image), image, candidate.uri)
        pool = tx.pools.find(image, host, vcpus, memory_mib)
        running = pool.running if cmd.running is None and pool else cmd.running or 0
        saved = pool.saved if cmd.saved is None and pool else cmd.saved or 0
        own = {pvm.id for pvm in tx.pool_vms.all(pool.id)} if pool else set()
        _check_room(tx, host, (vcpus, memory_mib), running, own)
        if pool is None:
            pool = Pool(id=new_pool_id(), image=image, host=host, vcpus=vcpus,
                        memory_mib=memory_mib, running=running, saved=saved, created_at=now)
            tx.pools.add(pool)
        else:
            current = tx.pools.get(pool.id, lock=True) or pool  # (gone: nothing is saved)
            pool = current.resized(running, saved)
            tx.pools.save(pool, current)
    deps.observers.pools_changed()
    return pool


def ensure_default_pool(deps: Deps, image: str, running: int, saved: int) -> Pool | None:
    """The pool `RIFT_DEFAULT_POOL` names, made when its image has no pool yet (one an
    operator set or resized is theirs, left as it is); None when there was one."""
    with deps.store.read() as tx:
        if any(pool.image == image for pool in tx.pools.all()):
            return None
    return set_pool(deps, command(PoolSetIn, image=image, running=running, saved=saved))


def _check_room(tx: Tx, host: str | None, size: tuple[int, int], running: int,
                own: set[str]) -> None:
    """Refuse a pool of `size` (vCPUs, MiB) that fits no usable host, or `running`
    VMs of it that do not fit (its `own` VMs' room counted free)."""
    vcpus, memory_mib = size
    _, loads = host_loads(tx, without=own)
    if host is not None:
        loads = [load for load in loads if load.name == host]
    usable = [load for load in loads if not load.drained]
    fits_any = [load for load in usable if load.vcpus >= vcpus and load.memory_mib >= memory_mib]
    where = f"host {host}" if host is not None else "any host"
    if not fits_any:
        raise PoolDoesNotFit(f"a VM of {vcpus} vCPU and {memory_mib} MiB fits on no usable "
                             f"host ({where}); rift host list shows their sizes", 0)
    fit = sum(room(load, vcpus, memory_mib) for load in usable)
    if running > fit:
        raise PoolDoesNotFit(f"{running} running VMs of {vcpus} vCPU and {memory_mib} MiB do "
                             f"not fit: room for {fit} on {where}", fit)


def clear_pool(deps: Deps, image: str) -> int:
    """Remove every pool of `image` and destroy its VMs now; answers how many VMs went."""
    with deps.store.write() as tx:
        pools = [p for p in tx.pools.all() if p.image == image]
        for pool in pools:
            change_pool(tx, pool.id, Pool.emptied)
    gone = 0
    for pool in pools:
        with deps.store.read() as tx:
            members = tx.pool_vms.all(pool.id)
        for pvm in members:
            gone += destroy_pool_vm(deps, pvm)
        with deps.store.write() as tx:
            if not tx.pool_vms.all(pool.id):
                tx.pools.delete(pool.id)
        deps.guests.keys.forget_task(pool.id)
    return gone


def pool_rows(deps: Deps) -> list[PoolRow]:
    with deps.store.read() as tx:
        pools = tx.pools.all()
        members = tx.pool_vms.all()
    return [PoolRow(pool,
                    sum(1 for m in members if m.pool_id == pool.id and m.state == "ready"
                        and m.goal == "running"),
                    sum(1 for m in members if m.pool_id == pool.id and m.state == "saved"))
            for pool in pools]


def pool_counts(deps: Deps) -> dict[tuple[str, str], int]:
    """(image, state) -> how many pool VMs: the `rift_pool_vms` gauge."""
    with deps.store.read() as tx:
        members = tx.pool_vms.all()
    counts: dict[tuple[str, str], int] = {}
    for m in members:
        counts[m.image, m.state] = counts.get((m.image, m.state), 0) + 1
    return counts
