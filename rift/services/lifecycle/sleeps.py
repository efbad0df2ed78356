"""Sleep and wake (SPEC §17): the running VMs of a task quiet for its sleep time
(`sleep_after_s`, else RIFT_TASK_SLEEP_S; 0 never) are saved like a pause
(libvirt's managed save) and turn `sleeping`, holding only their disk on their
host; the next call that needs one wakes it and is held until its guest answers.

Going to sleep is the sweep's (`sleep_quiet`): each VM is claimed by one
compare-and-set (running → running, `falling_asleep`) made in the transaction
that reads its task locked and finds it still quiet, so a call that touched the
task first keeps it awake, and one that comes after waits to wake it. Quiet is
measured from the task's last activity plus one activity step (the stored clock
moves at most once a step), so no call has begun for the sleep time; a call that
waits on a guest (an exec, a boot, a fork, a wake) moves the clock while it waits
(`leases.in_flight`). A VM with a running exec or a run of code in flight (SPEC
§20: code_records) stays awake unless its task says `sleep: "always"`.

A wake is one compare-and-set (sleeping → sleeping, `waking`): of calls racing
on one VM (threads or replicas), one wakes it and the others wait for it to run
(`wake`). The waker restores the domain and logs in again (the clock set as what
woke it allows: GuestLifecycle.resumed), records `vm_woke` with how long that took
(the view's `woke`); the VM stays awake its sleep time. A wake that fails leaves
nothing running: the domain destroyed, the VM `failed` with its event, the call
answered `guest_unreachable` with the reason. Reconciliation settles a sleep or
wake a crash cut short (pauses.settle_change).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from hypervisor.base import HypervisorError
from rift.domain.errors import (
    GuestUnreachable,
    NoCapacity,
    VmAsleep,
    VmNotFound,
    VmNotRunning,
)
from rift.domain.model import NewEvent, Task, Vm
from rift.services.context import SWEEP, Deps
from rift.services.lifecycle import code_records
from rift.services.lifecycle.capacity import host_loads, room
from rift.services.lifecycle.disk_budget import disk_floor_bytes
from rift.services.lifecycle.leases import in_flight
from rift.services.lifecycle.teardown import destroy_domain, host_uri, vm_ended
from rift.services.ports import Tx, WokenBy

T = TypeVar("T")
BATCH = 200
WAIT_STEP_S = 0.05  # how often a call waiting on another's wake looks again
_WAKES = 3  # a call found its VM asleep again this many times: it answers vm_not_running


# -- calls that need a VM ------------------------------------------------------------------

def awake(deps: Deps, actor: str, call: Callable[[], T], woken_by: WokenBy = "call") -> T:
    """Run `call` (a use case's step that checks its VM runs, `leases.check_running`);
    when it finds the VM asleep, wake it (`woken_by`: for what) and run it again."""
    for _ in range(_WAKES):
        try:
            return call()
        except VmAsleep as asleep:
            wake(deps, asleep.vm_id, actor, woken_by=woken_by)
    return call()


def wake(deps: Deps, vm_id: str, actor: str, *, woken_by: WokenBy = "call") -> Vm:
    """Wake a sleeping VM and answer it running; wait for one going to sleep or
    waking by another call. `vm_not_running` for any other status (a paused VM is
    its agent's: no call wakes it); `no_capacity` when its host has no room for it
    now; `guest_unreachable` when the wake fails (the VM is then `failed`).
    `woken_by`: what woke it (GuestLifecycle.resumed: how the guest's clock is set)."""
    began = time.monotonic()
    deadline = began + deps.runtime.boot_timeout_s + deps.limits.creating_grace_s
    while True:
        vm, mine = _claim_wake(deps, vm_id)
        if vm.status == "running" and vm.change is None:
            return vm
        if mine:
            return _wake(deps, vm, actor, began, woken_by)
        if time.monotonic() >= deadline:
            raise VmNotRunning(vm.id, vm.status, doing=vm.change)
        time.sleep(WAIT_STEP_S)


def _claim_wake(deps: Deps, vm_id: str) -> tuple[Vm, bool]:
    """The VM, and whether this call began its wake (its row now `waking`)."""
    with deps.store.write() as tx:
        vm = tx.vms.get(vm_id, lock=True)
        if vm is None:
            raise VmNotFound(vm_id)
        if vm.destroy_requested_at is not None:
            raise VmNotRunning(vm.id, vm.status)
        if vm.status == "running" and vm.change in (None, "falling_asleep"):
            return vm, False
        if (vm.status, vm.change) == ("sleeping", "waking"):
            return vm, False
        if (vm.status, vm.change) != ("sleeping", None):
            raise VmNotRunning(vm.id, vm.status, doing=vm.change)
        _check_room(tx, vm)
        waking = vm.changing("waking", deps.clock.now())
        if tx.vms.save(waking, vm):
            return waking, True
        return tx.vms.get(vm_id) or vm, False


def _check_room(tx: Tx, vm: Vm) -> None:
    _, loads = host_loads(tx)
    load = next((load for load in loads if load.name == vm.host), None)
    if load is None or room(load, vm.vcpus, vm.memory_mib) < 1:
        raise NoCapacity(vm.vcpus, vm.memory_mib, load.free_vcpus if load else 0,
                         load.free_memory_mib if load else 0)


def _wake(deps: Deps, vm: Vm, actor: str, began: float, woken_by: WokenBy) -> Vm:
    with deps.store.read() as tx:
        uri = host_uri(tx, vm.host)
    try:
        if uri is None:
            raise HypervisorError("restore", f"host {vm.host} is not known")
        with in_flight(deps, None if woken_by == "exposure" else vm.task_id,
                       deps.runtime.boot_timeout_s):  # an exposure's request: no task's call
            deps.hosts.hypervisor(uri).restore(vm.domain_name)
            if vm.ssh_port is not None:
                deps.guests.lifecycle.resumed(vm, deps.runtime.boot_timeout_s, woken_by=woken_by)
    except (HypervisorError, GuestUnreachable) as exc:
        reason = exc.message if isinstance(exc, GuestUnreachable) else str(exc)
        _fail(deps, vm, uri, f"its wake failed: {reason}", actor)
        raise GuestUnreachable(vm.id, f"its wake failed: {reason}") from exc
    ms = int((time.monotonic() - began) * 1000)
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is not None and (current.status, current.change) == ("sleeping", "waking"):
            woke, event = current.woke(ms, actor, now)
            if tx.vms.save(woke, current):
                tx.events.add(event)
        current = tx.vms.get(vm.id)
    deps.log.info("vm woke", extra={"vm_id": vm.id, "ms": ms})
    if current is None or current.status != "running":
        raise VmNotRunning(vm.id, current.status if current else "destroyed")
    return current


def _fail(deps: Deps, vm: Vm, uri: str | None, error: str, actor: str) -> None:
    """A wake that failed: nothing of the VM is left running, its row `failed`."""
    try:
        destroy_domain(deps, vm, uri)
    except Exception as exc:
        deps.log.warning("destroy after a failed wake refused",
                         extra={"vm_id": vm.id, "error": str(exc)})
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is not None and (current.status, current.change) == ("sleeping", "waking"):
            failed, event = current.failed(error, actor, now)
            if tx.vms.save(failed, current):
                tx.events.add(event)
                vm_ended(tx, current, now, actor)


# -- the sweep's part ----------------------------------------------------------------------

def _due(deps: Deps, tx: Tx, task: Task, vm_id: str, now: datetime) -> bool:
    """Its task quiet for the sleep time, and the VM not woken within it (a request
    to its exposure moves no task clock, and must not see it fall asleep again)."""
    after = task.sleeps_after_s(deps.limits.task_sleep_s)
    quiet = timedelta(seconds=after + deps.lease_rules.activity_step_s)
    woke = tx.events.of_type([task.id], "vm_woke", since=now - quiet)
    return (task.is_open and after > 0 and task.last_activity_at + quiet <= now
            and all(e.details.get("vm_id") != vm_id for e in woke))


def sleep_quiet(deps: Deps) -> list[str]:
    """Put to sleep the running VMs of every task quiet for its sleep time; answers
    the ids of the VMs that slept."""
    now = deps.clock.now()
    step = timedelta(seconds=deps.lease_rules.activity_step_s)
    default = deps.limits.task_sleep_s
    default_cutoff = now - step - timedelta(seconds=default) if default > 0 else None
    with deps.store.read() as tx:
        found = tx.fleet.sleep_candidates(default_cutoff, now - step, BATCH)
    slept: list[str] = []
    for vm in found:
        code_records.settle(deps, vm)  # its runs in flight that ended unread
        try:
            if put_to_sleep(deps, vm):
                slept.append(vm.id)
        except HypervisorError as exc:
            deps.log.warning("sleep refused", extra={"vm_id": vm.id, "error": str(exc)})
    if slept:
        deps.log.info("vms slept", extra={"vms": len(slept)})
    return slept


def put_to_sleep(deps: Deps, vm: Vm) -> bool:
    """Save one VM of a quiet task and record it `sleeping`; False when it is no
    longer due (a call came, an exec runs, it changed) or its host is short of disk.
    Raises HypervisorError when libvirt refused the save (the VM runs on)."""

    def due(tx: Tx, task: Task, now: datetime) -> dict[str, object] | None:
        if not _due(deps, tx, task, vm.id, now):
            return None
        if task.sleep != "always" and (tx.execs.of_task(task.id, vm.id, running_only=True)
                                       or code_records.busy(tx, vm.id, now)):
            return None
        return {"quiet_s": int((now - task.last_activity_at).total_seconds())}

    return _sleep(deps, vm.id, SWEEP, due)


def sleep_vm(deps: Deps, vm_id: str, actor: str, reason: str) -> bool:
    """Put a running VM to sleep now, quiet or not, execs running or not (the E2B
    door's `autoPause` at a sandbox's end); any call that needs it wakes it. False
    when it is not running with no change under way, or its host is short of disk.
    Raises HypervisorError when libvirt refused the save (the VM runs on)."""
    return _sleep(deps, vm_id, actor, lambda _tx, _task, _now: {"reason": reason})


Judge = Callable[[Tx, Task, datetime], "dict[str, object] | None"]


def _sleep(deps: Deps, vm_id: str, actor: str, judge: Judge) -> bool:
    """Claim the VM (running → falling asleep) when `judge`, given its task read
    locked, answers the `vm_slept` event's details; save it; record it asleep."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        # The task first, then the VM: the order a call's transaction takes them in.
        seen = tx.vms.get(vm_id)
        task = tx.tasks.get(seen.task_id) if seen else None  # locked: a touch waits
        current = tx.vms.get(vm_id, lock=True)
        if current is None or (current.status, current.change) != ("running", None) \
                or current.destroy_requested_at is not None:
            return False
        details = judge(tx, task, now) if task is not None and task.is_open else None
        uri = host_uri(tx, current.host)
        if details is None or uri is None or _low_disk(deps, current.host):
            return False
        changing = current.changing("falling_asleep", now)
        if not tx.vms.save(changing, current):
            return False
    deps.guests.lifecycle.drop_connections(vm_id)
    try:
        deps.hosts.hypervisor(uri).save(changing.domain_name)
    except HypervisorError:
        _settle(deps, changing, lambda v: (v.change_ended(), None))
        raise
    _settle(deps, changing, lambda v: v.slept(actor, deps.clock.now(), details))
    return True


def _low_disk(deps: Deps, host: str) -> bool:
    return host in deps.disk_room.low(disk_floor_bytes(deps))  # as check_host_disk


def _settle(deps: Deps, vm: Vm, step: Callable[[Vm], tuple[Vm, NewEvent | None]]) -> None:
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is not None and (current.status, current.change) == (vm.status, vm.change):
            new, event = step(current)
            if tx.vms.save(new, current) and event is not None:
                tx.events.add(event)


# -- reconciliation ------------------------------------------------------------------------

def settle_sleep(deps: Deps, vm: Vm, active: bool,
                 reason: str = "finishing a change a crash cut short") -> str | None:
    """A sleep or wake a crash cut short, or a sleeping VM whose domain was started
    outside Rift, by whether its domain runs: running is awake (`vm_woke`, its ms
    counted from when the change began), stopped with its saved state asleep
    (`vm_slept`); a change the domain contradicts is rolled back. Answers what was
    done, or None when the row moved meanwhile."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is None or (current.status, current.change) != (vm.status, vm.change):
            return None
        event: NewEvent | None = None
        if current.status == "running":  # falling asleep
            if active:
                new, done = current.change_ended(), "sleep rolled back"
            else:
                new, event = current.slept(SWEEP, now, {"reason": reason})
                done = "sleep finished"
        elif active:  # asleep or waking, and its domain runs
            waking = current if current.change == "waking" else current.changing("waking", now)
            since = current.change_at or now
            ms = max(0, int((now - since).total_seconds() * 1000))
            new, event = waking.woke(ms, SWEEP, now, {"reason": reason})
            done = "wake finished"
        else:
            new, done = current.change_ended(), "wake rolled back"
        if not tx.vms.save(new, current):
            return None
        if event is not None:
            tx.events.add(event)
    return done
