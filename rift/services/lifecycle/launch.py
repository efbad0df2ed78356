"""Starting a VM's domain: its kind of guest (rift.services.lifecycle.guest_kinds) plans
it, Rift creates it, the kind waits until the guest answers, and the row turns
`running` or `failed` (libvirt's or the guest's own words)."""

from __future__ import annotations

import random
import socket
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import datetime

from hypervisor.base import DomainSpec, HypervisorError, ImageError, elsewhere
from rift.domain import egress as egress_rules
from rift.domain.errors import HypervisorFailed, ImageNotFound, InvalidArgument
from rift.domain.model import StartKind, Task, Vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle.guest_kinds import GuestKind, NotReady, kind_on, usable
from rift.services.lifecycle.teardown import destroy_domain, destroy_vm
from rift.services.ports import Tx

SSH_HOST = "127.0.0.1"
BUILT_BY_RIFT = ("tiny", "debian")  # the images `rift image build` makes
PORTS = (20000, 60000)


def check_image(deps: Deps, kind: GuestKind, image: str, uri: str) -> None:
    """ImageNotFound unless `image` can start on the host at `uri` (on a real host it
    must be built, not only known), naming the images that can."""
    try:
        kind.check()
    except ImageError as exc:
        ready = [n for n in deps.images.names() if usable(kind_on(deps, uri, n))]
        hint = (f"the operator builds it: rift image build {image}" if image in BUILT_BY_RIFT
                else "rift_vm_new with one of those images")
        raise ImageNotFound(image, ready, hint=hint) from exc


def fixed_sizes(image: str, fixed: tuple[int, int, int] | None, vcpus: int | None,
                memory_mib: int | None,
                disk_gib: int | None) -> tuple[int | None, int | None, int | None]:
    """The sizes a VM (or pool) of `image` gets: as asked, unless the image starts
    from a saved state (made from a snapshot), whose sizes (`fixed`, the catalog's
    `fixed_sizes`) every VM has. Asking for others is invalid_argument, naming the
    sizes to leave out."""
    if fixed is None:
        return vcpus, memory_mib, disk_gib
    for field, asked, size in zip(("vcpus", "memory_mib", "disk_gib"),
                                  (vcpus, memory_mib, disk_gib), fixed, strict=True):
        if asked is not None and asked != size:
            raise InvalidArgument(field, f"image {image!r} starts from a saved state of "
                                  f"{fixed[0]} vCPU, {fixed[1]} MiB and {fixed[2]} GiB; "
                                  f"leave {field} out (or give {size})")
    return fixed


def pick_ssh_port(tx: Tx, host: str) -> int:
    """A loopback port of the host that no live VM or pool VM of it uses and, on a
    host of this machine, that is free now (ports are chosen per host)."""
    taken = {vm.ssh_port for vm in tx.fleet.live_on_host(host) if vm.ssh_port}
    taken |= {m.ssh_port for m in tx.pool_vms.all() if m.host == host and m.ssh_port}
    row = tx.hosts.get(host)
    remote = row is not None and elsewhere(row.uri)  # its loopback is not ours
    for _ in range(200):
        port = random.randrange(*PORTS)
        if port in taken:
            continue
        if remote:
            return port
        with socket.socket() as probe:
            try:
                probe.bind((SSH_HOST, port))
            except OSError:
                continue
        return port
    raise HypervisorFailed("no free loopback port for the guest's SSH", host=host)


def fail_start(deps: Deps, caller: Caller, vm: Vm, error: str) -> Vm:
    """A start that did not come to run: the row turns `failed` with its event,
    and the operator's log says why."""
    deps.log.warning("vm start failed", extra={"vm_id": vm.id, "host": vm.host,
                                               "image": vm.image, "error": error})
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id)
        if current is not None and current.status == "creating":
            failed, event = current.failed(error, caller.label, now)
            if tx.vms.save(failed, current):
                tx.events.add(event)
        return tx.vms.get(vm.id) or vm


def create_domain(deps: Deps, uri: str, spec: DomainSpec) -> None:
    """Define and start `spec`'s domain on the host at `uri`; a host elsewhere first
    gets the files it names (HypervisorError when they cannot be put there)."""
    deps.host_files.prepare(uri, spec)
    deps.hosts.hypervisor(uri).create(spec)


@dataclass(frozen=True)
class Start:
    """A VM being started for a call: its row, its host's URI, when the call began
    (`start.ms` counts from there) and, for a cold boot, when libvirt was asked
    (its event's `boot_s`)."""

    vm: Vm
    uri: str
    called: datetime
    booting_since: datetime | None = None


def launch(deps: Deps, caller: Caller, start: Start, kind: GuestKind) -> Vm:
    """Start the VM's domain as its kind does (`start.kind` `boot`, or `fork` for an
    image made from a snapshot)."""
    vm, uri = start.vm, start.uri
    started = deps.clock.now()
    try:
        # Marked with this installation: reconciliation's scope.
        spec = replace(kind.plan(vm), install=deps.install_id, restrict=vm.egress == "none",
                       proxied=egress_rules.proxied(vm.egress))
        create_domain(deps, uri, spec)
    except (HypervisorError, ImageError, HypervisorFailed) as exc:
        kind.clean_up(vm.id)  # nothing was defined: the VM's files are unused
        return fail_start(deps, caller, vm, str(exc))
    try:
        kind.wait_ready(vm)
    except NotReady as exc:
        # If libvirt refuses, the row still turns failed (not live), so the
        # next sweep's reconciliation destroys the orphaned domain.
        with suppress(HypervisorFailed):
            destroy_domain(deps, vm, uri)
        return fail_start(deps, caller, vm, str(exc))
    return running(deps, caller, replace(start, booting_since=started), kind.start_kind)


def running(deps: Deps, caller: Caller, start: Start, kind: StartKind,
            details: dict[str, object] | None = None) -> Vm:
    """The VM answers: its row turns `running` with how it started (`kind`: `boot`,
    `pool`, `restore`, `fork`) and the milliseconds since the call, unless the VM was
    destroyed or its task closed meanwhile (then the domain goes again). A cold
    boot's event has `boot_s`, since libvirt was asked."""
    vm, uri, called, boot_s_since = start.vm, start.uri, start.called, start.booting_since
    now = deps.clock.now()
    start_s = max(0.0, (now - called).total_seconds())
    start_ms = round(start_s * 1000)
    details = {**(details or {})}
    if boot_s_since is not None:
        details["boot_s"] = (now - boot_s_since).total_seconds()
    task: Task | None = None
    won = False
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id)
        if current is not None and current.status == "creating":
            started, event = current.running((kind, start_ms), caller.label, now, details)
            won = tx.vms.save(started, current)
        if won:
            tx.events.add(event)
            task = tx.tasks.get(vm.task_id)
    if not won or (task is not None and not task.is_open):
        # The task closed (or the VM was destroyed) while it was starting: take the
        # domain down again so nothing runs without a live row.
        destroy_domain(deps, vm, uri)
        with deps.store.read() as tx:
            current = tx.vms.get(vm.id) or vm
        if current.is_live:
            return destroy_vm(deps, current, caller.label, {"reason": "task closed"})
        return current
    deps.observers.vm_started(kind, start_s)
    deps.log.info("vm running", extra={"vm_id": vm.id, "task_id": vm.task_id, "host": vm.host,
                                       "start_kind": kind, "start_s": round(start_s, 3)})
    return replace(vm, status="running", ready_at=now, start_kind=kind, start_ms=start_ms)
