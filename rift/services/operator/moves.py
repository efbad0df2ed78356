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
and the report says why.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from hypervisor.base import HypervisorError, elsewhere
from hypervisor.domain_xml import domain_xml_with_ssh_port
from hypervisor.placement import HostLoad, choose_host, largest_free
from rift.domain import egress as egress_rules
from rift.domain.errors import InvalidArgument, NoCapacity
from rift.domain.model import Vm
from rift.services.context import OPERATOR, Deps
from rift.services.lifecycle.capacity import host_loads
from rift.services.lifecycle.guest_kinds import kind_on
from rift.services.lifecycle.launch import pick_ssh_port
from rift.services.operator.hosts import drain_host
from rift.services.operator.volume_moves import follow, move_detached, move_groups


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


def _volume_hosts(deps: Deps, source: str) -> list[str]:
    """The other hosts of this machine taking VMs, by name: where the volumes of host
    `source` may go (none for a host elsewhere: its files do not move yet)."""
    with deps.store.read() as tx:
        found = sorted(tx.hosts.all(), key=lambda h: h.name)
    if any(h.name == source and elsewhere(h.uri) for h in found):
        return []
    return [h.name for h in found if h.name != source and not elsewhere(h.uri)
            and not h.drained and h.unreachable_since is None]


def _why_volumes_stay(deps: Deps, source: str) -> str:
    with deps.store.read() as tx:
        host = tx.hosts.get(source)
    if host is not None and elsewhere(host.uri):
        return "it holds volumes, whose files on a host elsewhere do not move yet"
    return ("it holds volumes, whose files stay on this machine, and no other host of it "
            "takes VMs: rift_vm_detach_volume them to move it")


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
    volume_hosts = _volume_hosts(deps, name)
    if not volume_hosts:
        why_not = _why_volumes_stay(deps, name)
        stays.update({vm.id: why_not for g in groups for vm in g if held[vm.id]})
        groups = [g for g in groups if not any(held[vm.id] for vm in g)]
    report = MoveReport(stayed=[(vm.id, stays.get(vm.id) or _why_stays(vm))
                                for vm in live if vm.id in stays or vm.id not in movable])
    planned = plan_moves(deps, name, groups, {vm_id for vm_id, atts in held.items() if atts})
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
        report.volumes = [(vol, volume_hosts[0])
                          for vol in move_detached(deps, name, volume_hosts[0])]
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
    # what it reads from its host's disk, there first
    kind_on(deps, dest_host.uri, vm.image).receive(vm, deps.host_files)
    started = deps.clock.now()
    source.migrate(vm.domain_name, dest_host.uri, _address(dest_host.uri), xml)
    deps.guests.lifecycle.drop_connections(vm.id)  # they went through the old host
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is not None and current.status == "running":
            went = follow(tx, vm.id, dest)  # its volumes' rows name the host it went to
            there, event = current.moved((dest, port), OPERATOR, now, {
                "ms": round((now - started).total_seconds() * 1000),
                **({"volumes": went} if went else {})})
            tx.vms.save(there, current)
            tx.events.add(event)
        moved = tx.vms.get(vm.id)
    assert moved is not None
    deps.log.info("VM moved", extra={"vm_id": vm.id, "from": vm.host, "to": dest})
    return moved

