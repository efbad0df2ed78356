"""How a pool is filled in the background (SPEC §11): each pool is filled by one
replica at a time (`Pool.fill_claimed`), one start at a time per host, backing off
after failures (`Pool.start_failed`); its VMs carry a `mark` (the image's build and
the host's QEMU and libvirt), and one whose mark is stale is replaced. Extras are
trimmed, and a pool VM a crash cut short is found (`stale_pool_vms`) and destroyed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import replace
from datetime import datetime, timedelta

from hypervisor.base import HypervisorError, ImageError
from hypervisor.placement import choose_host
from rift.domain.errors import GuestUnreachable, HostDiskFull, HypervisorFailed, ImageNotFound
from rift.domain.ids import new_vm_id
from rift.domain.model import Host, Vm
from rift.domain.pools import Pool, PoolGoal, PoolVm
from rift.services.context import Deps
from rift.services.lifecycle.capacity import host_loads
from rift.services.lifecycle.code import code_ready
from rift.services.lifecycle.disk_budget import disk_floor_bytes
from rift.services.lifecycle.guest_kinds import GuestKind, NotReady, kind_on
from rift.services.lifecycle.launch import SSH_HOST, check_image, create_domain, pick_ssh_port
from rift.services.ports import Tx


def image_build(deps: Deps, image: str) -> str:
    """A digest of the image's files (names, sizes, times): a rebuild changes it."""
    folder = deps.runtime.image_folder(image)
    if folder is None:  # no real guests: no image files
        return "no-runtime"
    digest = hashlib.sha256(image.encode())
    with suppress(FileNotFoundError):
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.startswith("."):  # (forks' copies)
                facts = path.stat()
                digest.update(f"{path.name}:{facts.st_size}:{facts.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def mark_of(deps: Deps, uri: str, image: str) -> str:
    """What a pool VM of `image` on the host at `uri` is built from."""
    return f"{image_build(deps, image)}/{deps.hosts.hypervisor(uri).versions()}"


def _grace(deps: Deps) -> timedelta:
    """How long a start may take (`RIFT_VM_CREATING_GRACE_S`): a filler holds its pool
    that long, and a pool VM still starting or saving after it was cut by a crash."""
    return timedelta(seconds=deps.limits.creating_grace_s)


def refill(deps: Deps, filler: str) -> int:
    """One pass over every pool: replace stale VMs, trim extras, start one VM where a
    pool is short (one start at a time per host). Answers how many it made ready."""
    with deps.store.read() as tx:
        pools = tx.pools.all()
    made = 0
    busy_hosts: set[str] = set()
    for pool in pools:
        if pool.retry_at is not None and deps.clock.now() < pool.retry_at:
            continue
        now = deps.clock.now()
        with deps.store.write() as tx:  # of two replicas claiming at once, one holds it
            current = tx.pools.get(pool.id, lock=True)
            held = bool(current and current.free_for(filler, now) and tx.pools.save(
                current.fill_claimed(filler, now, now + _grace(deps)), current))
        if not held:
            continue  # another replica fills it now
        try:
            made += _fill(deps, pool, busy_hosts)
        finally:
            with deps.store.write() as tx:
                change_pool(tx, pool.id, Pool.fill_released)
    return made


def change_pool(tx: Tx, pool_id: str, change: Callable[[Pool], Pool]) -> bool:
    """Save ``change`` (a `Pool` transition) of the pool read locked; False if it is gone."""
    current = tx.pools.get(pool_id, lock=True)
    return current is not None and tx.pools.save(change(current), current)


def _fill(deps: Deps, pool: Pool, busy_hosts: set[str]) -> int:
    with deps.store.read() as tx:
        members = tx.pool_vms.all(pool.id)
        hosts = {h.name: h for h in tx.hosts.all()}
    marks: dict[str, str] = {}

    def mark(host: str) -> str | None:
        if host not in marks and host in hosts:
            try:
                marks[host] = mark_of(deps, hosts[host].uri, pool.image)
            except HypervisorError:
                return None
        return marks.get(host)

    kept: list[PoolVm] = []
    for pvm in members:
        settled = pvm.state in ("ready", "saved")
        current = mark(pvm.host)
        if settled and current is not None and pvm.mark != current:
            destroy_pool_vm(deps, pvm)  # its image was rebuilt or QEMU/libvirt changed
        else:
            kept.append(pvm)
    made = 0
    wants: tuple[tuple[PoolGoal, int], ...] = (("running", pool.running), ("saved", pool.saved))
    for goal, want in wants:
        mine = [m for m in kept if m.goal == goal]
        for extra in _extras(mine, want):
            destroy_pool_vm(deps, extra)
        if len(mine) < want:
            made += _start_one(deps, pool, goal, busy_hosts)
    return made


def _extras(members: list[PoolVm], want: int) -> list[PoolVm]:
    """The VMs past `want`, settled ones (newest first) before those still starting."""
    if len(members) <= want:
        return []
    settled = [m for m in members if m.state in ("ready", "saved")][::-1]
    return settled[: len(members) - want]


def _start_one(deps: Deps, pool: Pool, goal: PoolGoal, busy_hosts: set[str]) -> int:
    """Start one pool VM (boot, wait, and for a saved pool save it); 1 when it is
    ready, 0 when there was no room or it failed (the pool then backs off)."""
    reserved = _reserve(deps, pool, goal, busy_hosts)
    if reserved is None:
        return 0
    pvm, host, kind = reserved
    vm = pooled_vm(pvm)
    hv = deps.hosts.hypervisor(host.uri)
    try:
        create_domain(deps, host.uri, replace(kind.plan(vm), install=deps.install_id))
    except (HypervisorError, ImageError, HypervisorFailed) as exc:
        kind.clean_up(vm.id)
        _start_failed(deps, pool, pvm, str(exc), domain=False)
        return 0
    try:
        kind.wait_ready(vm)
        host_key = deps.guests.keys.host_key(vm.id) if pvm.ssh_port else None
        code_ready(deps, vm)  # handed out with its default kernel running (SPEC §20)
        if goal == "running" and pvm.ssh_port is not None:
            _standby(deps, vm)
        if goal == "saved":
            with deps.store.write() as tx:
                tx.pool_vms.save(pvm.saving(host_key), pvm)
            deps.guests.lifecycle.close_vm(vm.id)  # the save cuts its connections
            hv.save(vm.domain_name)
    except (NotReady, HypervisorError) as exc:
        _start_failed(deps, pool, pvm, str(exc), domain=True)
        return 0
    with deps.store.write() as tx:
        current = tx.pool_vms.get(pvm.id, lock=True)
        settled = (current is not None and current.state in ("starting", "saving")
                   and tx.pool_vms.save(current.settled(host_key, deps.clock.now()),
                                        current))
        change_pool(tx, pool.id, Pool.start_done)
    if not settled:  # cleared while it started
        destroy_pool_vm(deps, pvm)
        return 0
    deps.log.info("pool vm ready", extra={"vm_id": pvm.id, "image": pool.image,
                                          "host": host.name, "goal": goal})
    deps.observers.pools_changed()
    return 1


def _standby(deps: Deps, vm: Vm) -> None:
    """A shell waiting for its hand-over (else the hand-over opens a channel: slower)."""
    try:
        deps.guests.lifecycle.standby(vm)
    except GuestUnreachable as exc:
        deps.log.warning("pool vm has no standby shell", extra={"vm_id": vm.id,
                                                                "error": exc.message})


def _reserve(deps: Deps, pool: Pool, goal: PoolGoal,
             busy_hosts: set[str]) -> tuple[PoolVm, Host, GuestKind] | None:
    """The new pool VM's row (`starting`), on the host with most room: it counts
    against that host before its domain exists. None when no host has room or the
    image cannot start (the pool backs off)."""
    now = deps.clock.now()
    low_disk = deps.disk_room.low(disk_floor_bytes(deps))
    with deps.store.write() as tx:
        host = _pool_host(tx, pool, busy_hosts, low_disk)
        if host is None:
            return None
        kind = kind_on(deps, host.uri, pool.image)
        try:
            check_image(deps, kind, pool.image, host.uri)
        except ImageNotFound as exc:
            error = exc.message
            change_pool(tx, pool.id, lambda current: current.start_failed(error, now))
            return None
        port = kind.ssh_port(lambda: pick_ssh_port(tx, host.name))
        pvm = PoolVm(id=new_vm_id(), pool_id=pool.id, goal=goal, state="starting",
                     host=host.name, image=pool.image, vcpus=pool.vcpus,
                     memory_mib=pool.memory_mib, key_id=pool.id,
                     mark=mark_of(deps, host.uri, pool.image), created_at=now, ssh_port=port)
        tx.pool_vms.add(pvm)
    busy_hosts.add(host.name)
    return pvm, host, kind


def pooled_vm(pvm: PoolVm) -> Vm:
    """A VM value for the guest kind and the shell: the pool VM's id, size and
    address, and the pool key's id in `task_id`. It is never stored."""
    return Vm(id=pvm.id, task_id=pvm.key_id, owner="", name=pvm.id, image=pvm.image,
              status="creating", host=pvm.host, vcpus=pvm.vcpus, memory_mib=pvm.memory_mib,
              created_at=pvm.created_at, ssh_host=SSH_HOST if pvm.ssh_port else None,
              ssh_port=pvm.ssh_port)


def _pool_host(tx: Tx, pool: Pool, busy_hosts: set[str],
               low_disk: Mapping[str, int]) -> Host | None:
    """Where the pool's next VM starts: its host, or the one placement would choose
    (`choose_host`), never a host with a pool start under way nor one whose disk is
    under its floor (`low_disk`, name: free bytes, as placement leaves out; when
    only such a host had room the pool's last error says so)."""
    starting = {m.host for m in tx.pool_vms.all() if m.state in ("starting", "saving")}
    hosts, loads = host_loads(tx)
    open_hosts = [load for load in loads
                  if (pool.host is None or load.name == pool.host)
                  and load.name not in busy_hosts and load.name not in starting]
    chosen = choose_host([load for load in open_hosts if load.name not in low_disk],
                         pool.vcpus, pool.memory_mib)
    if chosen is None:
        short = choose_host(open_hosts, pool.vcpus, pool.memory_mib)
        if short is not None:
            note = HostDiskFull(short.name, low_disk[short.name]).message
            change_pool(tx, pool.id, lambda current: current.noted(note))
    return hosts[chosen.name] if chosen else None


def _start_failed(deps: Deps, pool: Pool, pvm: PoolVm, error: str, *, domain: bool) -> None:
    deps.log.warning("pool vm failed to start", extra={"vm_id": pvm.id, "image": pool.image,
                                                       "host": pvm.host, "error": error})
    if domain:
        destroy_pool_vm(deps, pvm)
    else:
        with deps.store.write() as tx:
            current = tx.pool_vms.get(pvm.id, lock=True)
            if current is not None and current.state in ("starting", "saving"):
                tx.pool_vms.take(current.removed())
    with deps.store.write() as tx:
        now = deps.clock.now()
        change_pool(tx, pool.id, lambda current: current.start_failed(error, now))


def destroy_pool_vm(deps: Deps, pvm: PoolVm) -> int:
    """As for VMs, the row outlives the domain: it turns `destroying` (so no hand-out
    takes it), the domain and files go, then the row. A crash or a refusal in
    between leaves a `destroying` row, which reconciliation destroys again.
    Answers 1 when this call removed it."""
    with deps.store.write() as tx:
        current = tx.pool_vms.get(pvm.id, lock=True)
        if current is None or not tx.pool_vms.save(current.destroying(), current):
            return 0
        host = tx.hosts.get(pvm.host)
    deps.guests.lifecycle.close_vm(pvm.id)
    if host is not None:
        try:
            deps.hosts.hypervisor(host.uri).destroy(f"rift-{pvm.id}")
        except HypervisorError as exc:
            deps.log.warning("pool vm destroy refused; reconciliation retries",
                             extra={"vm_id": pvm.id, "error": str(exc)})
            return 0
        kind_on(deps, host.uri, pvm.image).clean_up(pvm.id)
        deps.host_files.forget(host.uri, pvm.id)  # on a host elsewhere, its copies there
    with deps.store.write() as tx:
        current = tx.pool_vms.get(pvm.id, lock=True)
        return int(current is not None and current.state == "destroying"
                   and tx.pool_vms.take(current.removed()))


def stale_pool_vms(deps: Deps, listed: dict[str, tuple[set[str], datetime]]) -> list[str]:
    """Pool VMs a crash or a refusal cut (destroying, or starting or saving for
    longer than any start takes) and settled ones whose domain was missing from
    their host's listing (`listed`: each host's domain names and when its listing
    began; a VM settled after that is not judged): their domains go, then their
    rows."""
    cutoff = deps.clock.now() - _grace(deps)
    with deps.store.read() as tx:
        members = tx.pool_vms.all()
    gone = []
    for pvm in members:
        cut = (pvm.state == "destroying"
               or (pvm.state in ("starting", "saving") and pvm.created_at < cutoff))
        names, listed_at = listed.get(pvm.host, (None, None))
        vanished = (names is not None and listed_at is not None and pvm.ready_at is not None
                    and pvm.ready_at < listed_at and f"rift-{pvm.id}" not in names)
        if (cut or vanished) and destroy_pool_vm(deps, pvm):
            deps.log.warning("pool vm removed", extra={
                "vm_id": pvm.id, "reason": "cut by a crash" if cut else "its domain is gone"})
            gone.append(pvm.id)
    return gone
