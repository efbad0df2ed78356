"""Putting VMs away: record the request, destroy the domain, then mark the row
with its event.

Used by `rift_vm_destroy`, by every close, and by the sweep that finishes
closes and destroys a crash interrupted. The row turns `destroyed` only after
libvirt said the domain is gone, so a row never claims less than what runs;
the request recorded first tells reconciliation that a domain gone under a
live row was Rift's own destroy, cut short.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypervisor.base import HypervisorError
from rift.domain.errors import HypervisorFailed
from rift.domain.model import DESTROYABLE_VM_STATUSES, CloseReason, Task, Vm
from rift.services.context import Deps
from rift.services.lifecycle import code_records, exec_ends, exposure_ends, volume_ends
from rift.services.lifecycle.guest_kinds import kind_on
from rift.services.ports import Tx

_DESTROYABLE = DESTROYABLE_VM_STATUSES


def in_move(deps: Deps, vm: Vm) -> bool:
    """A live migration of the VM under way (`rift host drain --move` marks the row
    `moving` before it begins), its mark set less than `RIFT_VM_CREATING_GRACE_S` ago: no
    sweep fails, frees or destroys the VM meanwhile (its domain may be on either host
    or both; the drain renews the mark while it works). An older mark is a move whose
    process died: reconciliation settles it by where its domain runs
    (rift.services.operator.move_marks.adopt)."""
    if vm.change != "moving" or vm.change_at is None:
        return False
    return deps.clock.now() - vm.change_at < timedelta(seconds=deps.limits.creating_grace_s)


# -- the end of a VM's sub-resources -------------------------------------------------------

Ender = Callable[[Tx, Vm, datetime, str], None]

# What ends with a VM, each ended by its own module in the transaction that destroys or
# fails the VM. A new sub-resource of a VM (a volume, a code context) adds its ender
# here and touches no other service.
ENDERS: tuple[Ender, ...] = (
    exec_ends.end_for_vm,  # its running execs are lost
    exposure_ends.end_for_vm,  # its URLs answer 404 from the commit on
    volume_ends.end_for_vm,  # its volumes are detached, never deleted
    code_records.end_for_vm,  # its code contexts' rows go (the kernels went with it)
)


def vm_ended(tx: Tx, vm: Vm, now: datetime, actor: str) -> None:
    """In the transaction that destroys or fails `vm`: end what lives with it."""
    for end in ENDERS:
        end(tx, vm, now, actor)


def host_uri(tx: Tx, host_name: str) -> str | None:
    host = tx.hosts.get(host_name)
    return host.uri if host else None


def destroy_domain(deps: Deps, vm: Vm, uri: str | None) -> None:
    """Destroy and undefine the VM's domain; absent is fine. Raises HypervisorFailed."""
    deps.guests.lifecycle.close_vm(vm.id)  # calls in flight end with guest_unreachable
    if uri is None:
        return
    try:
        deps.hosts.hypervisor(uri).destroy(vm.domain_name)
    except HypervisorError as exc:
        raise HypervisorFailed(str(exc), host=vm.host) from exc
    kind_on(deps, uri, vm.image).clean_up(vm.id)
    deps.host_files.forget(uri, vm.id)  # on a host elsewhere, its copies there


def forget_task_key(deps: Deps, task_id: str) -> None:
    """The task's SSH key pair goes once no VM of the task can use it."""
    deps.guests.keys.forget_task(task_id)


def request_destroy(deps: Deps, vm: Vm) -> bool:
    """Record that the VM is to be destroyed (compare-and-set on a destroyable
    status), before libvirt is asked: a crash after the domain's destroy is then
    finished as a destroy by reconciliation. False when the row is no longer
    destroyable (another caller destroyed it meanwhile)."""
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is None or current.status not in _DESTROYABLE:
            return False
        if current.destroy_requested_at is not None:
            return True  # asked before (a cut destroy, a refusal): keep the first time
        return tx.vms.save(current.destroy_requested(deps.clock.now()), current)


def destroy_vm(deps: Deps, vm: Vm, actor: str, details: dict[str, Any] | None = None) -> Vm:
    """Destroy one VM's domain and record it; a VM already destroyed is answered as is.

    Three steps: the request on the row, the domain, then the row `destroyed` with
    its event. Each row step is a compare-and-set, so callers racing (an agent,
    a close, the sweep) make one event between them."""
    if vm.status == "destroyed":
        return vm
    if not request_destroy(deps, vm):
        with deps.store.read() as tx:
            return tx.vms.get(vm.id) or vm
    with deps.store.read() as tx:
        uri = host_uri(tx, vm.host)
    volume_ends.before_end(deps, vm)  # its guest writes out what its volumes cached
    destroy_domain(deps, vm, uri)
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is not None and current.status in _DESTROYABLE:
            destroyed, event = current.destroyed(actor, now, details)
            if tx.vms.save(destroyed, current):
                tx.events.add(event)
                vm_ended(tx, vm, now, actor)
        current = tx.vms.get(vm.id)
    return current or vm


def destroy_vms(deps: Deps, vms: Iterable[Vm], actor: str) -> tuple[list[str], list[str]]:
    """Destroy every VM given; answers (destroyed ids, ids libvirt refused).
    A refused one stays live in its row and the sweep tries it again."""
    done: list[str] = []
    refused: list[str] = []
    for vm in vms:
        if vm.status == "destroyed":
            continue
        try:
            destroy_vm(deps, vm, actor)
            done.append(vm.id)
        except HypervisorFailed as exc:
            deps.log.warning("destroy refused", extra={"vm_id": vm.id, "error": exc.message})
            refused.append(vm.id)
    return done, refused


@dataclass(frozen=True)
class Closing:
    """Who closes a task, why, when, and what its `closed` event adds."""

    actor: str
    reason: CloseReason
    now: datetime
    details: dict[str, Any] | None = None


def close_in_tx(tx: Tx, task: Task, closing: Closing) -> bool:
    """Mark the task closed (its `closed` transition, saved by compare-and-set) with
    its `closed` event. The VMs are destroyed after the commit by `destroy_vms`; a
    crash in between is finished by the sweep (`finish_closing`)."""
    vm_ids = [vm.id for vm in tx.vms.of_task(task.id) if vm.status in _DESTROYABLE]
    closed, event = task.closed(closing.actor, closing.reason, closing.now, vm_ids,
                                closing.details)
    if not tx.tasks.save(closed, expected_gen=task.lease_gen):
        return False
    tx.events.add(event)
    return True
