"""How `rift_vm_new` takes a VM from a pool (SPEC §11).

The hand-out deletes the pooled VM's `pool_vms` row and adds the task's VM row of
the same id in one transaction, so a pooled VM goes to exactly one task on every
replica. It boots with its pool's key (`key_id`, the pool's id); the hand-out
puts the task's key in its place, sets the clock and feeds the entropy pool, over
the connection the pool already holds (`GuestShell.hand_over`). A saved one is
restored first; one that fails its hand-over is destroyed and the VM boots cold.
"""

from __future__ import annotations

import threading
import time
from contextlib import suppress
from dataclasses import dataclass, replace

from hypervisor.base import Hypervisor, HypervisorError, ImageError
from rift.domain.errors import GuestUnreachable, HypervisorFailed
from rift.domain.model import StartKind, Vm
from rift.domain.pools import PoolGoal, PoolVm, PoolVmState
from rift.services.context import Caller, Deps
from rift.services.lifecycle.capacity import host_loads, room
from rift.services.lifecycle.guest_kinds import GuestKind, NotReady
from rift.services.lifecycle.launch import Start, launch, running
from rift.services.lifecycle.teardown import destroy_domain
from rift.services.ports import Tx


@dataclass(frozen=True)
class Taken:
    """A pooled VM just taken for a VM row: how it starts (`pool` or `restore`)."""

    vm: PoolVm
    kind: StartKind  # pool or restore


def take(tx: Tx, image: str, vcpus: int, memory_mib: int,
         only: str | None = None) -> Taken | None:
    """Take a pooled VM of that image and size for a new VM row (with `only`, one on
    that host): a running one first, else a saved one whose host has room to restore
    it; None when the pools have none. (Pooled VMs have the default disk, or their
    image's fixed one: a VM asking for another boots, and its caller asks no pool.)
    The take is a compare-and-set: a racing caller takes another."""
    sources: tuple[tuple[PoolVmState, PoolGoal, StartKind], ...] = (
        ("ready", "running", "pool"), ("saved", "saved", "restore"))
    found = {state: tx.pool_vms.candidates(image, vcpus, memory_mib, (state,))
             for state, _, _ in sources}
    if not any(found.values()):
        return None  # no pool of that kind: one indexed read, and placement as before
    _, loads = host_loads(tx)
    usable = {load.name: load for load in loads if not load.drained}
    for state, goal, kind in sources:
        for pvm in found[state]:
            load = usable.get(pvm.host)
            if load is None or pvm.goal != goal or only not in (None, pvm.host):
                continue
            if kind == "restore" and room(load, vcpus, memory_mib) < 1:
                continue
            if tx.pool_vms.take(pvm.handed_out()):
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
