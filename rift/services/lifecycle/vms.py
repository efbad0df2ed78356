"""VM use cases: new, get, destroy (by handle, or by id under attach's rules)."""

from __future__ import annotations

from datetime import datetime

from rift.contract.vms import VmDestroyIn, VmGetIn, VmNewIn, VmOut
from rift.domain import egress as egress_rules
from rift.domain.errors import (
    IdempotencyConflict,
    InvalidArgument,
    QuotaExceeded,
    VmNotFound,
)
from rift.domain.ids import new_vm_id
from rift.domain.model import DEFAULT_DISK_GIB, Egress, NewEvent, Task, Vm, default_memory_mib
from rift.domain.store_errors import DuplicateKey
from rift.services.context import Caller, Deps
from rift.services.lifecycle.capacity import Where, place
from rift.services.lifecycle.disk_budget import check_disk_budget, disk_floor_bytes
from rift.services.lifecycle.guest_kinds import GuestKind, kind_on
from rift.services.lifecycle.handouts import Taken, start_taken, take
from rift.services.lifecycle.image_access import check_visible
from rift.services.lifecycle.launch import (
    SSH_HOST,
    Start,
    check_image,
    fixed_sizes,
    launch,
    pick_ssh_port,
)
from rift.services.lifecycle.leases import (
    check_handle,
    check_rate,
    ensure_open,
    in_flight,
    in_write,
    owned_task,
    parse_handle,
    refuse_if_held,
)
from rift.services.lifecycle.tasks import request_digest
from rift.services.lifecycle.teardown import destroy_vm
from rift.services.lifecycle.vm_volumes import attach_at_start, check, check_paths, volumes_host
from rift.services.ports import Tx
from rift.services.ports.watch import Watch
from rift.services.read import views


def owned_vm(tx: Tx, caller: Caller, vm_id: str) -> Vm:
    vm = tx.vms.get(vm_id)
    if vm is None or vm.owner != caller.user:
        raise VmNotFound(vm_id)
    return vm


def get(deps: Deps, caller: Caller, cmd: VmGetIn) -> VmOut:
    """`rift_vm_get`: one VM of the caller's tasks."""
    with deps.store.read() as tx:
        return VmOut(vm=views.vm(tx, owned_vm(tx, caller, cmd.vm_id)))


def _check_vm_budget(deps: Deps, tx: Tx, caller: Caller, task: Task, now: datetime) -> None:
    limits = deps.limits
    if tx.vms.count_live(task.id) >= limits.max_vms_per_task:
        raise QuotaExceeded(f"VMs per task ({limits.max_vms_per_task})",
                            limits.max_vms_per_task, "rift_vm_destroy")
    check_disk_budget(deps, tx, caller.user)
    check_rate(tx, ("vms", caller.user), "VM creations", limits.rate_vm_new_per_h, now)


def _sizes(deps: Deps, image: str, cmd: VmNewIn) -> tuple[int, int, int, int]:
    """The new VM's vCPUs, memory and disk (defaults filled in, or its image's fixed
    sizes), and the disk its image's pooled VMs have."""
    fixed = deps.images.fixed_sizes(image)
    asked = cmd.model_fields_set  # a size left out takes the image's own, when it has one
    vcpus, memory_mib, disk_gib = fixed_sizes(
        image, fixed, cmd.vcpus if "vcpus" in asked else None, cmd.memory_mib,
        cmd.disk_gib if "disk_gib" in asked else None)
    return (1 if vcpus is None else vcpus,
            default_memory_mib(image) if memory_mib is None else memory_mib,
            DEFAULT_DISK_GIB if disk_gib is None else disk_gib,
            DEFAULT_DISK_GIB if fixed is None else fixed[2])


def _egress(value: object) -> Egress:
    """`open`, `none` or an allowlist (a dict, or the input's `allow`), as it is kept:
    its entries are the domain's to read (rift.domain.egress)."""
    allow = getattr(value, "allow", None)
    if allow is not None:
        value = {"allow": list(allow)}
    try:
        return egress_rules.canonical(value)
    except egress_rules.BadEntry as exc:
        raise InvalidArgument("egress", str(exc)) from None


def new(deps: Deps, caller: Caller, cmd: VmNewIn, watch: Watch | None = None) -> VmOut:
    """`rift_vm_new`: place, record (`creating`), create the domain, and answer once
    it runs or failed. A `watch` hears of the VM and its stage."""
    called = deps.clock.now()  # `start.ms` counts from here
    parsed = parse_handle(cmd.handle)
    name, idempotency_key = cmd.name, cmd.idempotency_key
    image = cmd.image if cmd.image is not None else deps.default_image
    vcpus, memory_mib, disk_gib, pooled_disk_gib = _sizes(deps, image, cmd)
    chosen = _egress(deps.default_egress if cmd.egress is None else cmd.egress)
    check_paths(cmd.volumes)
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
        check_visible(deps, tx, caller, image)  # SPEC §19: a built image is its owner's
        _check_vm_budget(deps, tx, caller, task, now)
        # Pooled VMs were made `open`: their network cannot change once they run.
        # Pooled VMs have their image's usual disk: another size boots.
        at = volumes_host(deps, tx, caller, cmd.volumes)  # SPEC §18: on its volumes' host
        taken = (take(tx, image, vcpus, memory_mib, only=at)
                 if chosen == "open" and disk_gib == pooled_disk_gib else None)
        if taken is not None:  # a pooled VM: its host, id and SSH port come with it
            host = tx.hosts.get(taken.vm.host)
            assert host is not None
            kind = kind_on(deps, host.uri, image)
            vm_id, port = taken.vm.id, taken.vm.ssh_port
        else:
            host = place(tx, vcpus, memory_mib, Where(egress_rules.proxied(chosen), at),
                         low_disk=deps.disk_room.low(disk_floor_bytes(deps)))
            kind = kind_on(deps, host.uri, image)
            check_image(deps, kind, image, host.uri)
            port = kind.ssh_port(lambda: pick_ssh_port(tx, host.name))
            vm_id = new_vm_id()
        check(tx, caller, cmd.volumes, host.name)  # SPEC §18: refused before the start
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
        return VmOut(vm=views.vm_of(vm))
    _tell(watch, vm, taken)
    with in_flight(deps, vm.task_id, deps.runtime.boot_timeout_s):  # the task's VMs stay awake
        if taken is not None:
            started = start_taken(deps, caller, Start(vm, uri, called), kind, taken)
            # Its replacement starts only now: a boot beside the hand-over would slow it.
            deps.observers.pools_changed()
        else:
            started = launch(deps, caller, Start(vm, uri, called), kind)
        return attach_at_start(deps, caller, cmd, started) or VmOut(vm=views.vm_of(started))


def _tell(watch: Watch | None, vm: Vm, taken: Taken | None) -> None:
    if watch is not None:
        watch.begun(vm.id)
        stage = ("booting" if taken is None else "handing over a pooled VM"
                 if taken.kind == "pool" else "restoring a saved state")
        watch.note(f"{vm.id}: {stage}")


def destroy(deps: Deps, caller: Caller, cmd: VmDestroyIn) -> VmOut:
    """`rift_vm_destroy`: one VM, under its task's handle, or by id under attach's rules."""
    vm_id, handle, takeover = cmd.vm_id, cmd.handle, cmd.takeover
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
            return VmOut(vm=views.vm_of(vm))
        if task.is_open:
            ensure_open(task)
            refuse_if_held(deps, task, now, takeover)
    return VmOut(vm=views.vm_of(destroy_vm(deps, vm, caller.label, {"takeover": takeover})))
