"""Moving running VMs between hosts (SPEC §14): `rift host drain NAME --move`.

Each move is libvirt's live migration: QEMU on the source streams the guest's
memory (and the blocks of its own disk, for an image with one) to a QEMU started
for it on the destination, then the domain runs there and is undefined here. The
guest goes on as it was: its processes (a background exec), its files, its SSH
host key; the VM's row then names the new host (and the SSH port chosen there),
with a `vm_moved` event, and Rift's connections to it are opened anew through
the new host. Handles, execs and exposures are the VM's, not the host's: they
keep working.

All or nothing before anything moves: every running VM of the host gets a
destination with room first (the other hosts that are active and answer),
else the drain is refused (`no_capacity`, naming the largest room) and nothing
moves. A migration that fails leaves that VM running where it was (libvirt's
own rollback); the others still move. A VM holding volumes moves with them to a
host of the same machine (their files are there), the VMs sharing a volume
together (rift.services.operator.volume_moves); where none takes VMs it stays,
and the report says why. From a host elsewhere a VM carries its volumes' files
to its destination, whichever it is (one VM per volume).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

from hypervisor.base import HypervisorError, elsewhere
from hypervisor.domain_xml import domain_xml_with_ssh_port
from hypervisor.placement import HostLoad, choose_host, largest_free
from rift.domain import egress as egress_rules
from rift.domain.errors import InvalidArgument, NoCapacity
from rift.domain.model import Host, Vm
from rift.services.context import OPERATOR, Deps
from rift.services.lifecycle.capacity import host_loads
from rift.services.lifecycle.guest_kinds import kind_on
from rift.services.lifecycle.launch import pick_ssh_port
from rift.services.operator.hosts import drain_host
from rift.services.operator.move_copies import Copy, record, settle
from rift.services.operator.move_marks import Freshness
from rift.services.operator.volume_moves import (
    carried_groups,
    carry,
    drop,
    follow,
    move_detached,
    move_detached_far,
    move_groups,
)


@dataclass
class MoveReport:
    moved: list[tuple[str, str]] = field(default_factory=list)  # (VM id, the host it went to)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (VM id, why), still there
    stayed: list[tuple[str, str]] = field(default_factory=list)  # (VM id, why not moved)
    volumes: list[tuple[str, str]] = field(default_factory=list)  # (volume id, its new host)


def _address(uri: str) -> str:
    """Where a host's QEMU takes a migration's stream: its URI's host (this machine
    for a local URI)."""
    return urlsplit(uri).hostname or "127.0.0.1"


def plan_moves(deps: Deps, source: str, groups: list[list[Vm]],
               here_only: Collection[str] = ()) -> dict[str, str]:
    """A destination with room for each group of VMs, all of a group on one host (VM
    id -> host name); a group with a VM in `here_only` (it holds volumes) on a host of
    this machine. NoCapacity, before anything moves, when one does not fit."""
    with deps.store.read() as tx:
        hosts, loads = host_loads(tx)
    free = {load.name: load for load in loads if load.name != source}
    planned: dict[str, str] = {}
    for group in sorted(groups, key=lambda g: -sum(v.memory_mib for v in g)):  # largest first
        vcpus, memory = sum(v.vcpus for v in group), sum(v.memory_mib for v in group)
        local = any(v.id in here_only for v in group)
        room = [load for load in free.values()
                if not (local and elsewhere(hosts[load.name].uri))]
        chosen = choose_host(room, vcpus, memory)
        if chosen is None:
            free_vcpus, free_mem = largest_free(room)
            raise NoCapacity(vcpus, memory, free_vcpus, free_mem)
        planned.update({vm.id: chosen.name for vm in group})
        free[chosen.name] = HostLoad(chosen.name, chosen.vcpus, chosen.memory_mib,
                                     chosen.used_vcpus + vcpus,
                                     chosen.used_memory_mib + memory, False)
    return planned


def _why_stays(vm: Vm) -> str:
    if egress_rules.proxied(vm.egress):
        return ("its egress is an allowlist: its egress proxy serves the control plane's "
                "own host only and would not follow it")
    return f"{vm.status}: only running VMs move"


def _volume_hosts(deps: Deps, source: Host) -> list[Host]:
    """Where the volumes no VM holds on host `source` go, the first first: the other
    hosts taking VMs that answer, this machine's by name (the same folder), then for
    a host elsewhere (its files are copied) those elsewhere by name."""
    with deps.store.read() as tx:
        found = sorted(tx.hosts.all(), key=lambda h: (elsewhere(h.uri), h.name))
    far = elsewhere(source.uri)
    return [h for h in found if h.name != source.name and (far or not elsewhere(h.uri))
            and not h.drained and h.unreachable_since is None]


WHY_VOLUMES_STAY = ("it holds volumes, whose files stay on this machine, and no other host "
                    "of it takes VMs: rift_vm_detach_volume them to move it")


def drain_and_move(deps: Deps, name: str) -> MoveReport:
    """Drain host `name` (it takes no new VMs) and move its running VMs elsewhere, a
    VM holding volumes with them (rift.services.operator.volume_moves)."""
    with deps.store.read() as tx:
        host = tx.hosts.get(name)
        live = tx.fleet.live_on_host(name) if host is not None else []
        held = tx.volumes.of_vms([vm.id for vm in live])
        holders = {att.volume_id: tx.volumes.holders(att.volume_id)
                   for atts in held.values() for att in atts}
    if host is None:
        raise InvalidArgument("name", f"no host {name!r} (rift host list)")
    movable = {vm.id for vm in live if vm.status == "running" and vm.change is None
               and not egress_rules.proxied(vm.egress)}
    groups, stays = move_groups(live, movable, held, holders)
    volume_hosts = _volume_hosts(deps, host)
    far = elsewhere(host.uri)  # its volumes' files go with their VMs
    if far:
        groups, shared = carried_groups(groups, held, holders)
        stays.update(shared)
    elif not volume_hosts:
        stays.update({vm.id: WHY_VOLUMES_STAY for g in groups for vm in g if held[vm.id]})
        groups = [g for g in groups if not any(held[vm.id] for vm in g)]
    report = MoveReport(stayed=[(vm.id, stays.get(vm.id) or _why_stays(vm))
                                for vm in live if vm.id in stays or vm.id not in movable])
    planned = plan_moves(deps, name, groups,
                         () if far else {vm_id for vm_id, atts in held.items() if atts})
    drain_host(deps, name)
    for vm in (vm for g in groups for vm in g):
        try:
            moved = move_vm(deps, vm, planned[vm.id])
        except HypervisorError as exc:
            report.failed.append((vm.id, exc.message))
            deps.log.warning("a move failed: the VM runs where it was",
                             extra={"vm_id": vm.id, "host": name, "error": exc.message})
            continue
        report.moved.append((vm.id, moved.host))
    if volume_hosts:
        first = volume_hosts[0]
        went = (move_detached_far(deps, name, host.uri, first.name, first.uri) if far
                else move_detached(deps, name, first.name))
        report.volumes = [(vol, first.name) for vol in went]
    return report


def move_vm(deps: Deps, vm: Vm, dest: str) -> Vm:
    """Live-migrate one running VM to host `dest`; its row follows, with its event.
    HypervisorError (and nothing changed) when libvirt could not move it."""
    with deps.store.read() as tx:
        source_host, dest_host = tx.hosts.get(vm.host), tx.hosts.get(dest)
    assert source_host is not None and dest_host is not None
    source = deps.hosts.hypervisor(source_host.uri)
    with deps.store.write() as tx:  # a port of the destination no VM there uses
        port = pick_ssh_port(tx, dest)
    try:
        xml = domain_xml_with_ssh_port(source.domain_xml(vm.domain_name), port)
    except ValueError as exc:
        raise HypervisorError("migrate", f"{vm.domain_name}: {exc}") from exc
    started = deps.clock.now()
    copies = [Copy("vm", vm.id, dest_host.uri)]
    _mark(deps, vm, copies)  # no sweep fails it while its domain is between the hosts
    with deps.store.read() as tx:  # marked, it takes no attach or detach
        held = tx.volumes.of_vms([vm.id])[vm.id]
    carried = bool(held) and (elsewhere(source_host.uri) or elsewhere(dest_host.uri))
    try:
        with Freshness(deps, vm):  # the mark stays recent while this process works
            if carried:  # a drain killed before the rows name them: reconciliation
                copies += [Copy("volume", att.volume_id, dest_host.uri) for att in held]
                record(deps, copies[1:])
            # what it reads from its host's disk, there first
            kind_on(deps, dest_host.uri, vm.image).receive(vm, deps.host_files)
            if carried:  # their files are on the source's machine only: they go too
                carry(deps, held, source_host.uri, dest_host.uri)
            try:
                source.migrate(vm.domain_name, dest_host.uri, _address(dest_host.uri), xml,
                               copy_volumes=carried)
            except HypervisorError:
                if carried:
                    drop(deps, [att.volume_id for att in held], dest_host.uri)
                raise
    except Exception:
        _unmark(deps, vm)
        raise
    deps.guests.lifecycle.drop_connections(vm.id)  # they went through the old host
    moved, went = _written(deps, vm, (dest, port), started)
    if moved.host == dest:
        settle(deps, copies)  # the rows name them now
    if carried and moved.host == dest:
        drop(deps, went, source_host.uri)  # the rows name the destination's files now
    deps.log.info("VM moved", extra={"vm_id": vm.id, "from": vm.host, "to": dest})
    return moved


def _written(deps: Deps, vm: Vm, to: tuple[str, int], started: datetime) -> tuple[Vm, list[str]]:
    """The row names the host it went to (and its volumes' rows), with its event,
    unless it changed meanwhile (a destroy); answers the row and the volumes that
    followed."""
    now = deps.clock.now()
    went: list[str] = []
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if (current is not None and current.status == "running"
                and current.change in (None, "moving")):
            went = follow(tx, vm.id, to[0])  # its volumes' rows name the host it went to
            there, event = current.moved(to, OPERATOR, now, {
                "ms": round((now - started).total_seconds() * 1000),
                **({"volumes": went} if went else {})})
            tx.vms.save(there, current)
            tx.events.add(event)
        moved = tx.vms.get(vm.id)
    assert moved is not None
    return moved, went


def _mark(deps: Deps, vm: Vm, copies: list[Copy]) -> None:
    """The copies the move will make are recorded (rift.services.operator.move_copies:
    those of a drain killed before its rows name them go), then the row is `moving`
    (a compare-and-set on running with no change under way) before anything is copied
    or migrated: reconciliation then leaves it alone while the domain may be on
    either host, and execs, files and exposures still go through. HypervisorError,
    nothing moved, when the VM changed since it was read."""
    record(deps, copies)
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if (current is None or current.host != vm.host or current.destroy_requested_at
                is not None or (current.status, current.change) != ("running", None)):
            state = "gone" if current is None else current.change or current.status
            refused = HypervisorError("migrate", f"{vm.id} is {state} now: not moved")
        else:
            tx.vms.save(current.changing("moving", deps.clock.now()), current)
            return
    settle(deps, copies)  # none made
    raise refused


def _unmark(deps: Deps, vm: Vm) -> None:
    """The move did not happen: the row is as it was, with no change under way."""
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is not None and (current.status, current.change) == ("running", "moving"):
            tx.vms.save(current.change_ended(), current)
