"""VM use cases: new, get, destroy (by handle, or by id under attach's rules)."""

from __future__ import annotations

from datetime import datetime

from rift.contract.base import MAX_DISK_GIB
from rift.contract.views import VmView
from rift.domain import egress as egress_rules
from rift.domain.errors import (
    IdempotencyConflict,
    ImageNotFound,
    InvalidArgument,
    QuotaExceeded,
    VmNotFound,
)
from rift.domain.ids import new_vm_id
from rift.domain.model import DEFAULT_DISK_GIB, NewEvent, Task, Vm, default_memory_mib
from rift.domain.store_errors import DuplicateKey
from rift.services.context import Caller, Deps
from rift.services.lifecycle import validate
from rift.services.lifecycle.capacity import place
from rift.services.lifecycle.disk_budget import check_disk_budget, disk_floor_bytes
from rift.services.lifecycle.exposures import vm_view
from rift.services.lifecycle.guest_kinds import GuestKind, kind_on
from rift.services.lifecycle.launch import SSH_HOST, check_image, fixed_sizes, launch, pick_ssh_port
from rift.services.lifecycle.leases import (
    check_handle,
    check_rate,
    ensure_open,
    in_write,
    owned_task,
    parse_handle,
    refuse_if_held,
)
from rift.services.lifecycle.pools import Taken, start_taken, take
from rift.services.lifecycle.tasks import request_digest
from rift.services.lifecycle.teardown import destroy_vm
from rift.services.ports import Tx
from rift.services.ports.watch import Watch


def owned_vm(tx: Tx, caller: Caller, vm_id: str) -> Vm:
    vm = tx.vms.get(vm_id)
    if vm is None or vm.owner != caller.user:
        raise VmNotFound(vm_id)
    return vm


def get_vm(deps: Deps, caller: Caller, vm_id: str) -> VmView:
    validate.vm_id(vm_id)
    with deps.store.read() as tx:
        return vm_view(tx, owned_vm(tx, caller, vm_id))


def _check_vm_budget(deps: Deps, tx: Tx, caller: Caller, task: Task, now: datetime) -> None:
    limits = deps.limits
    if tx.vms.count_live(task.id) >= limits.max_vms_per_task:
        raise QuotaExceeded(f"VMs per task ({limits.max_vms_per_task})",
                            limits.max_vms_per_task, "rift_vm_destroy")
    check_disk_budget(deps, tx, caller.user)
    check_rate("VM creations", limits.rate_vm_new_per_h, now,
               lambda since: tx.vms.count_created_since(caller.user, since),
               lambda since: tx.vms.oldest_created_since(caller.user, since))


def _sizes(deps: Deps, image: str, vcpus: int | None, memory_mib: int | None,
           disk_gib: int | None) -> tuple[int, int, int, int]:
    """The new VM's vCPUs, memory and disk (defaults filled in, or its image's fixed
    sizes), and the disk its image's pooled VMs have."""
    fixed = deps.images.fixed_sizes(image)
    vcpus, memory_mib, disk_gib = fixed_sizes(image, fixed, vcpus, memory_mib, disk_gib)
    vcpus = validate.integer("vcpus", 1 if vcpus is None else vcpus, 1, 64)
    memory_mib = validate.integer(
        "memory_mib", default_memory_mib(image) if memory_mib is None else memory_mib, 64, 65536)
    disk_gib = validate.integer("disk_gib", DEFAULT_DISK_GIB if disk_gib is None else disk_gib,
                                1, MAX_DISK_GIB)
    return vcpus, memory_mib, disk_gib, DEFAULT_DISK_GIB if fixed is None else fixed[2]


def new_vm(deps: Deps, caller: Caller, handle: str | None, name: str | None = None,
           image: str | None = None, vcpus: int | None = None, memory_mib: int | None = None,
           idempotency_key: str | None = None, disk_gib: int | None = None,
           egress: object = None, watch: Watch | None = None) -> VmView:
    """Place, record (`creating`), create the domain, and answer once it runs or failed.
    A `watch` hears of the VM and its stage."""
    called = deps.clock.now()  # `start.ms` counts from here
    parsed = parse_handle(handle)
    validate.text("name", name)
    validate.text("idempotency_key", idempotency_key)
    image = image if image is not None else deps.default_image
    validate.text("image", image)
    vcpus, memory_mib, disk_gib, pooled_disk_gib = _sizes(deps, image, vcpus, memory_mib,
                                                          disk_gib)
    chosen = validate.egress(deps.default_egress if egress is None else egress)
    digest = request_digest(task=parsed.task_id, name=name, image=image, vcpus=vcpus,
                            memory_mib=memory_mib, disk_gib=disk_gib, egress=chosen)

    def record(tx: Tx) -> tuple[Vm, str | None, GuestKind | None, Taken | None, bool]:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, parsed, now)
        if idempotency_key is not None:
            existing = tx.vms.find_by_key(caller.user, idempotency_key)
            if existing is not None:
                if existing.request_digest != digest:
                    raise IdempotencyConflict("rift_vm_new")
                return existing, None, None, None, True
        known = deps.images.names()
        if image not in known:
            raise ImageNotFound(image, sorted(known))
        _check_vm_budget(deps, tx, caller, task, now)
        # Pooled VMs were made `open`: their network cannot change once they run.
        taken = (take(tx, image, vcpus, memory_mib, disk_gib, pooled_disk_gib)
                 if chosen == "open" else None)
        if taken is not None:  # a pooled VM: its host, id and SSH port come with it
            host = tx.hosts.get(taken.vm.host)
            assert host is not None
            kind = kind_on(deps, host.uri, image)
            vm_id, port = taken.vm.id, taken.vm.ssh_port
        else:
            host = place(tx, vcpus, memory_mib,
                         low_disk=deps.disk_room.low(disk_floor_bytes(deps)))
            kind = kind_on(deps, host.uri, image)
            check_image(deps, kind, image, host.uri)
            port = kind.ssh_port(lambda: pick_ssh_port(tx, host.name))
            vm_id = new_vm_id()
        vm = Vm(id=vm_id, task_id=task.id, owner=caller.user, name=name or vm_id, image=image,
                status="creating", host=host.name, vcpus=vcpus, memory_mib=memory_mib,
                disk_gib=disk_gib, created_at=now, idempotency_key=idempotency_key,
                request_digest=digest, ssh_host=SSH_HOST if port else None, ssh_port=port,
                egress=chosen)
        tx.vms.add(vm)
        tx.events.add(NewEvent(task.id, "vm_creating", now, caller.label,
                               {"vm_id": vm_id, "name": vm.name, "image": image, "host": host.name,
                               "vcpus": vcpus, "memory_mib": memory_mib, "disk_gib": disk_gib,
                               "egress": egress_rules.view(chosen),
                               "start": kind.start_kind if taken is None else taken.kind}))
        return vm, host.uri, kind, taken, False

    try:
        vm, uri, kind, taken, replayed = in_write(deps.store, record)
    except DuplicateKey:
        # A racing twin won: replay it (what this try took from a pool went back
        # with its rolled-back transaction).
        vm, uri, kind, taken, replayed = in_write(deps.store, record)
    if replayed or uri is None or kind is None:
        return VmView.of(vm)
    _tell(watch, vm, taken)
    if taken is not None:
        started = start_taken(deps, caller, vm, uri, kind, taken, called)
        # Its replacement starts only now: a boot beside the hand-over would slow it.
        deps.observers.pools_changed()
        return VmView.of(started)
    return VmView.of(launch(deps, caller, vm, uri, kind, called))


def _tell(watch: Watch | None, vm: Vm, taken: Taken | None) -> None:
    if watch is not None:
        watch.begun(vm.id)
        stage = ("booting" if taken is None else "handing over a pooled VM"
                 if taken.kind == "pool" else "restoring a saved state")
        watch.note(f"{vm.id}: {stage}")


def destroy(deps: Deps, caller: Caller, vm_id: str, handle: str | None = None,
            takeover: bool = False) -> VmView:
    """Destroy one VM: under the task's handle, or by id under attach's rules."""
    if not isinstance(vm_id, str):
        raise InvalidArgument("vm_id", "must be a string")
    validate.vm_id(vm_id)
    now = deps.clock.now()
    if handle is not None:
        parsed = parse_handle(handle)

        def by_handle(tx: Tx) -> Vm:
            task = check_handle(deps, tx, caller, parsed, now)
            vm = owned_vm(tx, caller, vm_id)
            if vm.task_id != task.id:
                raise VmNotFound(vm_id)
            return vm

        vm = in_write(deps.store, by_handle)
    else:
        with deps.store.read() as tx:
            vm = owned_vm(tx, caller, vm_id)
            task = owned_task(tx, caller, vm.task_id)
        if vm.status == "destroyed":
            return VmView.of(vm)
        if task.is_open:
            ensure_open(task)
            refuse_if_held(deps, task, now, takeover)
    return VmView.of(destroy_vm(deps, vm, caller.label, {"takeover": takeover}))
