"""Pools of ready VMs (SPEC §11): what operators ask for, how a pool is filled in
the background, and how `rift_vm_new` takes a VM from one.

A pooled VM is no one's. Its id (`vm_…`) is made when it starts, and names its
domain and files from then on, but no view shows it until it is handed out: the
hand-out deletes its `pool_vms` row and adds the task's VM row of the same id in
one transaction, so a pooled VM goes to exactly one task on every replica. It
boots with its pool's key (`key_id`, the pool's id); the hand-out puts the
task's key in its place, sets the clock and feeds the entropy pool, over the
connection the pool already holds (`GuestShell.hand_over`).

A `running` pool keeps VMs booted (state `ready`); a `saved` pool keeps VMs that
were booted and then saved by libvirt (managed save, state `saved`), restored on
hand-out. Each pool is filled by one replica at a time (`claim_fill`), one start
at a time per host, backing off after failures; its VMs carry a `mark` (the
image's build and the host's QEMU and libvirt), and one whose mark is stale is
replaced.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from hypervisor.base import Hypervisor, HypervisorError, ImageError
from hypervisor.placement import choose_host
from rift.contract.base import command
from rift.contract.operator import PoolSetIn
from rift.domain.errors import (
    GuestUnreachable,
    HostDiskFull,
    HypervisorFailed,
    ImageNotFound,
    InvalidArgument,
    PoolDoesNotFit,
)
from rift.domain.ids import new_pool_id, new_vm_id
from rift.domain.model import Host, StartKind, Vm, default_memory_mib
from rift.domain.records import Pool, PoolGoal, PoolVm, PoolVmState
from rift.services.context import Caller, Deps
from rift.services.lifecycle.capacity import host_loads, room
from rift.services.lifecycle.disk_budget import disk_floor_bytes
from rift.services.lifecycle.guest_kinds import GuestKind, NotReady, kind_on
from rift.services.lifecycle.launch import (
    SSH_HOST,
    Start,
    check_image,
    create_domain,
    fixed_sizes,
    launch,
    pick_ssh_port,
    running,
)
from rift.services.lifecycle.teardown import destroy_domain
from rift.services.ports import Tx

BACKOFF_S = (5, 15, 60, 300)  # after the 1st, 2nd, 3rd, later failed start in a row
DEFAULT_VCPUS = 1


@dataclass(frozen=True)
class Taken:
    """A pooled VM just taken for a VM row: how it starts (`pool` or `restore`)."""

    vm: PoolVm
    kind: StartKind  # pool or restore


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


# -- what an image and a host are built from ---------------------------------------------------

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


# -- the operator's side ---------------------------------------------------------------------

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
        own = {pvm.id for pvm in tx.pools.vms(pool.id)} if pool else set()
        _check_room(tx, host, (vcpus, memory_mib), running, own)
        if pool is None:
            pool = Pool(id=new_pool_id(), image=image, host=host, vcpus=vcpus,
                        memory_mib=memory_mib, running=running, saved=saved, created_at=now)
            tx.pools.add(pool)
        else:
            tx.pools.update(pool.id, running=running, saved=saved, failures=0, retry_at=None,
                            last_error=None)
            pool = replace(pool, running=running, saved=saved, failures=0, retry_at=None,
                           last_error=None)
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
            tx.pools.update(pool.id, running=0, saved=0)
    gone = 0
    for pool in pools:
        with deps.store.read() as tx:
            members = tx.pools.vms(pool.id)
        for pvm in members:
            gone += destroy_pool_vm(deps, pvm)
        with deps.store.write() as tx:
            if not tx.pools.vms(pool.id):
                tx.pools.delete(pool.id)
        deps.guests.keys.forget_task(pool.id)
    return gone


def pool_rows(deps: Deps) -> list[PoolRow]:
    with deps.store.read() as tx:
        pools = tx.pools.all()
        members = tx.pools.vms()
    return [PoolRow(pool,
                    sum(1 for m in members if m.pool_id == pool.id and m.state == "ready"
                        and m.goal == "running"),
                    sum(1 for m in members if m.pool_id == pool.id and m.state == "saved"))
            for pool in pools]


def pool_counts(deps: Deps) -> dict[tuple[str, str], int]:
    """(image, state) -> how many pool VMs: the `rift_pool_vms` gauge."""
    with deps.store.read() as tx:
        members = tx.pools.vms()
    counts: dict[tuple[str, str], int] = {}
    for m in members:
        counts[m.image, m.state] = counts.get((m.image, m.state), 0) + 1
    return counts


# -- hand-out ------------------------------------------------------------------------------

def take(tx: Tx, image: str, vcpus: int, memory_mib: int) -> Taken | None:
    """Take a pooled VM of that image and size for a new VM row: a running one
    first, else a saved one whose host has room to restore it; None when the pools
    have none. (Pooled VMs have the default disk, or their image's fixed one: a VM
    asking for another boots, and its caller asks no pool.) The take is a
    compare-and-set: a racing caller takes another."""
    sources: tuple[tuple[PoolVmState, PoolGoal, StartKind], ...] = (
        ("ready", "running", "pool"), ("saved", "saved", "restore"))
    found = {state: tx.pools.candidates(image, vcpus, memory_mib, (state,))
             for state, _, _ in sources}
    if not any(found.values()):
        return None  # no pool of that kind: one indexed read, and placement as before
    _, loads = host_loads(tx)
    usable = {load.name: load for load in loads if not load.drained}
    for state, goal, kind in sources:
        for pvm in found[state]:
            load = usable.get(pvm.host)
            if load is None or pvm.goal != goal:
                continue
            if kind == "restore" and room(load, vcpus, memory_mib) < 1:
                continue
            if tx.pools.take(pvm.handed_out()):
                return Taken(pvm, kind)
    return None


def as_pooled(vm: Vm, taken: Taken) -> Vm:
    """The VM as the guest shell knew it in its pool: logging in with the pool key."""
    return replace(vm, task_id=taken.vm.key_id)


def hand_over(deps: Deps, vm: Vm, uri: str, kind: GuestKind, taken: Taken) -> None:
    """Make the taken VM the task's: restore it if it was saved, swap the pool key
    for the task's, set its clock, and mark its domain with the task. Raises
    HypervisorError, NotReady or GuestUnreachable when it cannot (the caller then
    destroys it and boots another). Logs how long each step took."""
    hv = deps.hosts.hypervisor(uri)
    pooled = as_pooled(vm, taken)
    steps: dict[str, float] = {}
    mark = time.monotonic()

    def step(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps[f"{name}_ms"] = round((now - mark) * 1000, 1)
        mark = now

    if taken.kind == "restore":
        hv.restore(vm.domain_name)
        step("restore")
        if vm.ssh_port is not None:
            timeout_s = deps.runtime.boot_timeout_s
            deps.guests.lifecycle.reconnect(pooled, taken.vm.host_key, timeout_s)
            step("reconnect")
    if vm.ssh_port is not None:
        deps.guests.lifecycle.hand_over(pooled, vm.task_id, time.time())
        step("keys")
    deps.log.info("vm handed over", extra={"vm_id": vm.id, "start": taken.kind, **steps})
    # The domain's metadata names its task for people reading virsh; reconciliation
    # goes by the VM id, so it is written after the answer, off the call's path.
    threading.Thread(target=_mark_owner, args=(deps, hv, vm), daemon=True,
                     name="rift-owner").start()


def _mark_owner(deps: Deps, hv: Hypervisor, vm: Vm) -> None:
    try:
        hv.set_owner(vm.domain_name, vm.task_id)
    except HypervisorError as exc:
        deps.log.warning("could not mark a handed-out domain with its task",
                         extra={"vm_id": vm.id, "error": str(exc)})


HAND_OVER_FAILURES = (HypervisorError, NotReady, GuestUnreachable, HypervisorFailed, ImageError)


def start_taken(deps: Deps, caller: Caller, start: Start, kind: GuestKind,
                taken: Taken) -> Vm:
    """Hand the taken VM over and turn its row running (`start.kind` pool or
    restore, its `ms` since the call). One that fails its hand-over (its guest
    gone) is destroyed and the VM boots cold under the same id: a miss is never an
    error."""
    vm, uri = start.vm, start.uri
    try:
        hand_over(deps, vm, uri, kind, taken)
    except HAND_OVER_FAILURES as exc:
        deps.log.warning("pooled vm failed its hand-over; booting one",
                         extra={"vm_id": vm.id, "start": taken.kind, "error": str(exc)})
        with suppress(HypervisorFailed):
            destroy_domain(deps, vm, uri)
        return launch(deps, caller, start, kind)
    return running(deps, caller, start, taken.kind)


# -- filling -----------------------------------------------------------------------------

def _grace(deps: Deps) -> timedelta:
    """How long a start may take (`RIFT_VM_CREATING_GRACE_S`): a filler holds its pool
    that long, and a pool VM still starting or saving after it was cut by a crash."""
    return timedelta(seconds=deps.limits.creating_grace_s)


def refill(deps: Deps, filler: str) -> int:
    """One pass over every pool: replace stale VMs, trim extras, start one VM where
    a pool is short (one start at a time per host). Answers how many VMs it made
    ready."""
    with deps.store.read() as tx:
        pools = tx.pools.all()
    made = 0
    busy_hosts: set[str] = set()
    for pool in pools:
        if pool.retry_at is not None and deps.clock.now() < pool.retry_at:
            continue
        now = deps.clock.now()
        with deps.store.write() as tx:
            held = tx.pools.claim_fill(pool.id, filler, now, now + _grace(deps))
        if not held:
            continue  # another replica fills it now
        try:
            made += _fill(deps, pool, busy_hosts)
        finally:
            with deps.store.write() as tx:
                tx.pools.update(pool.id, filler=None, fill_until=None)
    return made


def _fill(deps: Deps, pool: Pool, busy_hosts: set[str]) -> int:
    with deps.store.read() as tx:
        members = tx.pools.vms(pool.id)
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
        if goal == "running" and pvm.ssh_port is not None:
            _standby(deps, vm)
        if goal == "saved":
            with deps.store.write() as tx:
                tx.pools.save_vm(pvm.saving(host_key), pvm)
            deps.guests.lifecycle.close_vm(vm.id)  # the save cuts its connections
            hv.save(vm.domain_name)
    except (NotReady, HypervisorError) as exc:
        _start_failed(deps, pool, pvm, str(exc), domain=True)
        return 0
    with deps.store.write() as tx:
        current = tx.pools.get_vm(pvm.id, lock=True)
        settled = (current is not None and current.state in ("starting", "saving")
                   and tx.pools.save_vm(current.settled(host_key, deps.clock.now()),
                                        current))
        tx.pools.update(pool.id, failures=0, retry_at=None, last_error=None)
    if not settled:  # cleared while it started
        destroy_pool_vm(deps, pvm)
        return 0
    deps.log.info("pool vm ready", extra={"vm_id": pvm.id, "image": pool.image,
                                          "host": host.name, "goal": goal})
    deps.observers.pools_changed()
    return 1


def _standby(deps: Deps, vm: Vm) -> None:
    """A shell waiting in the guest for its hand-over; without one the hand-over
    opens a channel of its own (slower, as correct)."""
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
            _failed(tx, pool, now, exc.message)
            return None
        port = kind.ssh_port(lambda: pick_ssh_port(tx, host.name))
        pvm = PoolVm(id=new_vm_id(), pool_id=pool.id, goal=goal, state="starting",
                     host=host.name, image=pool.image, vcpus=pool.vcpus,
                     memory_mib=pool.memory_mib, key_id=pool.id,
                     mark=mark_of(deps, host.uri, pool.image), created_at=now, ssh_port=port)
        tx.pools.add_vm(pvm)
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
    starting = {m.host for m in tx.pools.vms() if m.state in ("starting", "saving")}
    hosts, loads = host_loads(tx)
    open_hosts = [load for load in loads
                  if (pool.host is None or load.name == pool.host)
                  and load.name not in busy_hosts and load.name not in starting]
    chosen = choose_host([load for load in open_hosts if load.name not in low_disk],
                         pool.vcpus, pool.memory_mib)
    if chosen is None:
        short = choose_host(open_hosts, pool.vcpus, pool.memory_mib)
        if short is not None:
            tx.pools.update(pool.id, last_error=HostDiskFull(
                short.name, low_disk[short.name]).message[:500])
    return hosts[chosen.name] if chosen else None


def _failed(tx: Tx, pool: Pool, now: datetime, error: str) -> None:
    current = tx.pools.get(pool.id)
    failures = (current.failures if current else pool.failures) + 1
    wait_s = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
    tx.pools.update(pool.id, failures=failures, last_error=error[:500],
                    retry_at=now + timedelta(seconds=wait_s))


def _start_failed(deps: Deps, pool: Pool, pvm: PoolVm, error: str, *, domain: bool) -> None:
    deps.log.warning("pool vm failed to start", extra={"vm_id": pvm.id, "image": pool.image,
                                                       "host": pvm.host, "error": error})
    if domain:
        destroy_pool_vm(deps, pvm)
    else:
        with deps.store.write() as tx:
            current = tx.pools.get_vm(pvm.id, lock=True)
            if current is not None and current.state in ("starting", "saving"):
                tx.pools.take(current.removed())
    with deps.store.write() as tx:
        _failed(tx, pool, deps.clock.now(), error)


def destroy_pool_vm(deps: Deps, pvm: PoolVm) -> int:
    """As for VMs, the row outlives the domain: it turns `destroying` (so no hand-out
    takes it), the domain and files go, then the row. A crash or a refusal in
    between leaves a `destroying` row, which reconciliation destroys again.
    Answers 1 when this call removed it."""
    with deps.store.write() as tx:
        current = tx.pools.get_vm(pvm.id, lock=True)
        if current is None or not tx.pools.save_vm(current.destroying(), current):
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
        current = tx.pools.get_vm(pvm.id, lock=True)
        return int(current is not None and current.state == "destroying"
                   and tx.pools.take(current.removed()))


def stale_pool_vms(deps: Deps, listed: dict[str, tuple[set[str], datetime]]) -> list[str]:
    """Pool VMs a crash or a refusal cut (destroying, or starting or saving for
    longer than any start takes) and settled ones whose domain was missing from
    their host's listing (`listed`: each host's domain names and when its listing
    began; a VM settled after that is not judged): their domains go, then their
    rows."""
    cutoff = deps.clock.now() - _grace(deps)
    with deps.store.read() as tx:
        members = tx.pools.vms()
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
