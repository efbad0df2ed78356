"""Pause and resume (SPEC §12): a paused VM's memory is saved by libvirt (managed
save) and its domain stops, so it holds no vCPUs or memory on its host, only its
disk and its saved state; a resume restores it where it was, with its processes,
execs and files.

Each change is recorded on the row before libvirt is asked (`change`: `pausing`
or `resuming`, since `change_at`), by compare-and-set on the status with no
change under way, and ends with a second compare-and-set and its event
(`vm_paused`, `vm_resumed`). A call that finds the same change under way waits
for it and answers the VM as it then is; reconciliation finishes or rolls back
a change that a crash cut short (`settle_change`), by what the host shows.
"""

from __future__ import annotations

import time
from typing import Literal

from hypervisor.base import DomainRecord, HypervisorError
from rift.contract.vms import VmHeldIn, VmOut
from rift.domain.errors import (
    GuestUnreachable,
    HypervisorFailed,
    NoCapacity,
    VmAsleep,
    VmNotFound,
    VmNotRunning,
)
from rift.domain.model import Vm, VmChange, VmStatus
from rift.services.context import SWEEP, Caller, Deps
from rift.services.lifecycle.capacity import host_loads, room
from rift.services.lifecycle.disk_budget import check_disk_budget, check_host_disk
from rift.services.lifecycle.leases import check_handle, in_write, parse_handle
from rift.services.lifecycle.sleeps import awake, settle_sleep
from rift.services.ports import Tx
from rift.services.read import views

WAIT_STEP_S = 0.1  # how often a call waiting on another's change looks again
Want = Literal["paused", "running"]
# What each wanted status is reached from, the change that leads there, and its event.
_ROUTES: dict[Want, tuple[VmStatus, VmChange, str]] = {
    "paused": ("running", "pausing", "vm_paused"),
    "running": ("paused", "resuming", "vm_resumed"),
}


def pause(deps: Deps, caller: Caller, cmd: VmHeldIn) -> VmOut:
    """`rift_vm_pause`: save the VM's memory and stop its domain; a paused VM is
    answered as it is."""
    vm = _claim(deps, caller, cmd, "paused")
    if vm.status == "paused":
        return _view(deps, vm)
    hv = deps.hosts.hypervisor(_uri(deps, vm))
    deps.guests.lifecycle.drop_connections(vm.id)  # calls in flight end now, not mid-save
    try:
        hv.save(vm.domain_name)
    except HypervisorError as exc:
        _undo(deps, vm, "running", "pausing")
        raise HypervisorFailed(str(exc), host=vm.host) from exc
    return _view(deps, _settle(deps, vm, "paused", caller.label))


def resume(deps: Deps, caller: Caller, cmd: VmHeldIn) -> VmOut:
    """`rift_vm_resume`: restore a paused VM where it was (its host must have room
    again), log in again and set its clock; a running VM is answered as it is."""
    vm = awake(deps, caller.label, lambda: _claim(deps, caller, cmd, "running"))
    if vm.status == "running":
        return _view(deps, vm)
    hv = deps.hosts.hypervisor(_uri(deps, vm))
    try:
        hv.restore(vm.domain_name)
    except HypervisorError as exc:
        _undo(deps, vm, "paused", "resuming")
        raise HypervisorFailed(str(exc), host=vm.host) from exc
    if vm.ssh_port is not None:
        timeout_s = deps.runtime.boot_timeout_s
        try:
            deps.guests.lifecycle.resumed(vm, timeout_s)
        except GuestUnreachable as exc:  # it runs: its calls say what fails
            deps.log.warning("resumed guest does not answer", extra={
                "vm_id": vm.id, "error": exc.message})
    return _view(deps, _settle(deps, vm, "running", caller.label))


def _view(deps: Deps, vm: Vm) -> VmOut:
    with deps.store.read() as tx:
        return VmOut(vm=views.vm(tx, vm))


def _claim(deps: Deps, caller: Caller, cmd: VmHeldIn, want: Want) -> Vm:
    """The handle's VM with the change toward `want` begun on its row by this call
    (its `change` set); or, when it is `want` already, as it is, after waiting
    for any change under way to end. Refuses a VM that is neither `want` nor its
    source (`vm_not_running`)."""
    parsed = parse_handle(cmd.handle)
    vm_id = cmd.vm_id
    source, change, _event = _ROUTES[want]
    deadline = time.monotonic() + deps.limits.creating_grace_s

    def begin(tx: Tx) -> tuple[Vm, bool]:
        """The VM, and whether this call began the change (False: nothing to do,
        or another change is under way)."""
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        vm = tx.vms.get(vm_id)
        if vm is None or vm.task_id != task.id:
            raise VmNotFound(vm_id)
        if vm.status == "sleeping" and vm.change is None and vm.destroy_requested_at is None:
            if want == "running":
                raise VmAsleep(vm.id, vm.status)  # resume wakes it (SPEC §17)
            # Asleep, its memory is saved already: the pause is a change of status.
            paused, event = vm.paused(caller.label, now, {"was": "sleeping"})
            if tx.vms.save(paused, vm):
                tx.events.add(event)
            return tx.vms.get(vm.id) or vm, False
        if vm.status not in (source, want, "sleeping") or vm.destroy_requested_at is not None:
            raise VmNotRunning(vm_id, vm.status)
        if vm.status == want or vm.change is not None:
            return vm, False
        if want == "running":
            _check_room(tx, vm)
        else:
            check_disk_budget(deps, tx, task.owner)
            check_host_disk(deps, vm.host)
        changing = vm.changing(change, now)
        if not tx.vms.save(changing, vm):
            return tx.vms.get(vm.id) or vm, False
        return changing, True

    while True:
        vm, began = in_write(deps.store, begin)
        if began or (vm.status == want and vm.change is None):
            return vm
        if vm.change is not None:  # another call's change: wait for its end
            if time.monotonic() >= deadline:
                raise VmNotRunning(vm_id, vm.status, doing=vm.change)
            time.sleep(WAIT_STEP_S)


def _check_room(tx: Tx, vm: Vm) -> None:
    """A paused VM resumes on its own host (its disk and saved state are there):
    NoCapacity unless that host has room for it now."""
    _, loads = host_loads(tx)
    load = next((load for load in loads if load.name == vm.host), None)
    if load is None or room(load, vm.vcpus, vm.memory_mib) < 1:
        free_vcpus = load.free_vcpus if load else 0
        free_mem = load.free_memory_mib if load else 0
        raise NoCapacity(vm.vcpus, vm.memory_mib, free_vcpus, free_mem)


def _uri(deps: Deps, vm: Vm) -> str:
    with deps.store.read() as tx:
        host = tx.hosts.get(vm.host)
    if host is None:
        raise HypervisorFailed(f"host {vm.host} is not known", host=vm.host)
    return host.uri


def _undo(deps: Deps, vm: Vm, status: VmStatus, change: VmChange) -> None:
    """libvirt refused the change: the VM is as it was, with no change under way."""
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id)
        if current is not None and (current.status, current.change) == (status, change):
            tx.vms.save(current.change_ended(), current)


def _settle(deps: Deps, vm: Vm, want: Want, actor: str,
            details: dict[str, object] | None = None) -> Vm:
    """The change toward `want` is done: the row turns `want`, with its event (a
    compare-and-set: of a call and the sweep settling one change, one wins)."""
    source, change, _event = _ROUTES[want]
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id)
        if current is not None and (current.status, current.change) == (source, change):
            done = current.paused if want == "paused" else current.resumed
            settled, event = done(actor, now, details)
            if tx.vms.save(settled, current):
                tx.events.add(event)
        current = tx.vms.get(vm.id)
    return current or vm


# -- reconciliation ------------------------------------------------------------------------

def settle_change(deps: Deps, vm: Vm, domain: DomainRecord | None) -> str | None:
    """A change a crash cut short, judged by the VM's domain in its host's listing:
    a domain stopped with a saved state is paused, a running one running; the
    change is finished (with its event) or rolled back to match. Answers what was
    done, or None when the domain shows neither (gone, or stopped with no saved
    state): the caller fails the VM."""
    if vm.change is None or domain is None:
        return None
    reached: Want | None = "running" if domain.active else "paused" if domain.saved else None
    if reached is None:
        return None
    if vm.change in ("falling_asleep", "waking"):
        return settle_sleep(deps, vm, domain.active)
    source, change, _event = _ROUTES[reached]
    if vm.change == change and vm.status == source:
        _settle(deps, vm, reached, SWEEP, {"reason": "finishing a change a crash cut short"})
        return f"{change} finished"
    _undo(deps, vm, vm.status, vm.change)
    return f"{vm.change} rolled back"
