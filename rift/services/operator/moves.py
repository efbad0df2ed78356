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
own rollback); the others still move. A VM holding volumes stays (a volume's
file does not move yet, SPEC §18), and the report says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from hypervisor.base import HypervisorError
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


@dataclass
class MoveReport:
    moved: list[tuple[str, str]] = field(default_factory=list)  # (VM id, the host it went to)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (VM id, why), still there
    stayed: list[tuple[str, str]] = field(default_factory=list)  # (VM id, why not moved)


def _address(uri: str) -> str:
    """Where a host's QEMU takes a migration's stream: its URI's host (this machine
    for a local URI)."""
    return urlsplit(uri).hostname or "127.0.0.1"


def plan_moves(deps: Deps, source: str, vms: list[Vm]) -> dict[str, str]:
    """A destination with room for each VM (VM id -> host name); NoCapacity, before
    anything moves, when one does not fit."""
    with deps.store.read() as tx:
        _hosts, loads = host_loads(tx)
    free = {load.name: load for load in loads if load.name != source}
    planned: dict[str, str] = {}
    for vm in sorted(vms, key=lambda v: -v.memory_mib):  # the largest first
        chosen = choose_host(list(free.values()), vm.vcpus, vm.memory_mib)
        if chosen is None:
            free_vcpus, free_mem = largest_free(list(free.values()))
            raise NoCapacity(vm.vcpus, vm.memory_mib, free_vcpus, free_mem)
        planned[vm.id] = chosen.name
        free[chosen.name] = HostLoad(chosen.name, chosen.vcpus, chosen.memory_mib,
                                     chosen.used_vcpus + vm.vcpus,
                                     chosen.used_memory_mib + vm.memory_mib, False)
    return planned


def _why_stays(vm: Vm, volumes: list[str]) -> str:
    if egress_rules.proxied(vm.egress):
        return ("its egress is an allowlist: its egress proxy serves the control plane's "
                "own host only and would not follow it")
    if vm.status == "running" and volumes:
        return (f"it holds volumes ({', '.join(volumes)}), whose files stay on this host: "
                "rift_vm_detach_volume them to move it")
    return f"{vm.status}: only running VMs move"


def drain_and_move(deps: Deps, name: str) -> MoveReport:
    """Drain host `name` (it takes no new VMs) and move its running VMs elsewhere."""
    with deps.store.read() as tx:
        host = tx.hosts.get(name)
        live = tx.fleet.live_on_host(name) if host is not None else []
        held = tx.volumes.of_vms([vm.id for vm in live])
    if host is None:
        raise InvalidArgument("name", f"no host {name!r} (rift host list)")
    running = [vm for vm in live if vm.status == "running" and vm.change is None
               and not egress_rules.proxied(vm.egress) and not held[vm.id]]
    report = MoveReport(stayed=[(vm.id, _why_stays(vm, [a.volume_id for a in held[vm.id]]))
                                for vm in live if vm not in running])
    planned = plan_moves(deps, name, running)
    drain_host(deps, name)
    for vm in running:
        try:
            moved = move_vm(deps, vm, planned[vm.id])
        except HypervisorError as exc:
            report.failed.append((vm.id, exc.message))
            deps.log.warning("a move failed: the VM runs where it was",
                             extra={"vm_id": vm.id, "host": name, "error": exc.message})
            continue
        report.moved.append((vm.id, moved.host))
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
            there, event = current.moved((dest, port), OPERATOR, now, {
                "ms": round((now - started).total_seconds() * 1000)})
            tx.vms.save(there, current)
            tx.events.add(event)
        moved = tx.vms.get(vm.id)
    assert moved is not None
    deps.log.info("VM moved", extra={"vm_id": vm.id, "from": vm.host, "to": dest})
    return moved

