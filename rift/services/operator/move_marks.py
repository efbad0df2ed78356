"""A move's mark on its VM's row (`change="moving"`, `rift host drain --move`): kept
fresh while the drain works, and, left stale by a drain that died, settled by where
the VM's domain runs, never by losing a VM that runs.

The drain marks the row before it copies anything and ends the mark when it writes
the row's new host (rift.services.operator.moves). While it copies and migrates, a
thread of its process (`Freshness`) sets the mark's time anew every `REFRESH_S` (a
quarter of the grace if that is shorter), so
a migration longer than `RIFT_VM_CREATING_GRACE_S` keeps its mark recent
(rift.services.lifecycle.teardown.in_move) and only a dead drain's mark goes stale.

A stale mark whose domain is gone from the row's host (`adopt`, from
reconciliation's check of the row): a drain killed after the switchover but before
it wrote the row. Each other host of this installation is listed; where the
domain runs (active) on exactly one, the row is written as the drain would have
(`moved`: that host and the SSH port its domain forwards, its volumes' rows
following, its `vm_moved` event), by a compare-and-set on the row as it was read
(still moving, on its host, with that mark), and the volumes' files the drain
carried are removed from the source as it would have. Where no host runs it, the
caller rolls back or fails it as before; where several do, or a host that may have
it does not answer (and is not yet lost), the row is left as it is for a later
sweep and nothing is destroyed.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace

from hypervisor.base import HypervisorError, elsewhere
from rift.domain.model import Host, Vm
from rift.services.context import SWEEP, Deps
from rift.services.lifecycle.launch import pick_ssh_port
from rift.services.operator.volume_moves import drop, follow

REFRESH_S = 60.0  # how often a working drain sets its mark's time anew
LEFT = "left"  # `adopt`'s answer when it cannot tell where the domain runs: nothing done
_HOSTFWD = re.compile(r"hostfwd=tcp:127\.0\.0\.1:(\d+)-:22")


def refresh(deps: Deps, vm: Vm) -> bool:
    """The mark's time is now (a compare-and-set: only while the row is still marked
    moving on the host the move left); False once it is not."""
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if current is None or current.host != vm.host or current.destroy_requested_at \
                is not None or (current.status, current.change) != ("running", "moving"):
            return False
        return tx.vms.save(replace(current, change_at=deps.clock.now()), current)


class Freshness:
    """While the drain copies and migrates (`with Freshness(deps, vm):`), its mark is
    set anew every `REFRESH_S` from a thread of its process."""

    def __init__(self, deps: Deps, vm: Vm, every: float | None = None) -> None:
        self._deps, self._vm = deps, vm
        self._every = min(REFRESH_S, deps.limits.creating_grace_s / 4) if every is None \
            else every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"move-mark-{vm.id}",
                                        daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                if not refresh(self._deps, self._vm):
                    return
            except Exception as exc:  # a store hiccup: the next tick tries again
                self._deps.log.warning("a move's mark was not refreshed", extra={
                    "vm_id": self._vm.id, "error": str(exc)})

    def __enter__(self) -> Freshness:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _where_it_runs(deps: Deps, vm: Vm, hosts: list[Host]) -> list[Host] | None:
    """The other hosts whose listing shows the VM's domain running; None when one
    that may have it does not answer (one lost past RIFT_HOST_LOST_S is skipped)."""
    found: list[Host] = []
    for host in hosts:
        if host.name == vm.host:
            continue
        try:
            listed = deps.hosts.hypervisor(host.uri).list_domains()
        except HypervisorError:
            since = host.unreachable_since
            if since is None or (deps.clock.now() - since).total_seconds() \
                    < deps.limits.host_lost_s:
                return None
            continue
        if any(d.vm_id == vm.id and d.install == deps.install_id and d.active
               and d.name == vm.domain_name for d in listed):
            found.append(host)
    return found


def _ssh_port(deps: Deps, vm: Vm, dest: Host) -> int:
    """The port the domain on `dest` forwards to its SSH (the drain wrote it into the
    domain's XML), else one no VM of `dest` uses (as the drain picked it)."""
    try:
        ports = _HOSTFWD.findall(deps.hosts.hypervisor(dest.uri).domain_xml(vm.domain_name))
    except HypervisorError:
        ports = []
    if len(ports) == 1:
        return int(ports[0])
    with deps.store.write() as tx:
        return pick_ssh_port(tx, dest.name)


def adopt(deps: Deps, vm: Vm, left_on: str | None = None) -> str | None:
    """A row read stale-marked moving whose domain is gone from its host (or only
    defined there, shut off: `left_on`, that host's URI, where it is then undefined):
    written as moved to the one other host running its domain (answers what was
    done), `LEFT` when that cannot be told, None when no host runs it (the caller
    settles it)."""
    with deps.store.read() as tx:
        hosts = tx.hosts.all()
    running = _where_it_runs(deps, vm, hosts)
    if running is None or len(running) > 1:
        deps.log.warning("a killed move's VM left as it is: where it runs is unclear",
                         extra={"vm_id": vm.id, "hosts": [h.name for h in running or []]})
        return LEFT
    if not running:
        return None
    dest = running[0]
    port = _ssh_port(deps, vm, dest)
    source = next((h for h in hosts if h.name == vm.host), None)
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id, lock=True)
        if (current is None or current.host != vm.host or current.change_at != vm.change_at
                or current.destroy_requested_at is not None
                or (current.status, current.change) != ("running", "moving")):
            return LEFT  # changed since it was read: what changed it settles it
        went = follow(tx, vm.id, dest.name)
        there, event = current.moved((dest.name, port), SWEEP, now, {
            "reason": "finishing a move whose drain died after the switchover",
            **({"volumes": went} if went else {})})
        if not tx.vms.save(there, current):
            return LEFT
        tx.events.add(event)
    deps.guests.lifecycle.drop_connections(vm.id)  # they went through the old host
    if left_on is not None:
        try:  # its definition only: its files are the destination's too on this machine
            deps.hosts.hypervisor(left_on).destroy(vm.domain_name)
        except HypervisorError as exc:
            deps.log.warning("a moved VM's old definition stays", extra={
                "vm_id": vm.id, "error": str(exc)})
    if went and source is not None and (elsewhere(source.uri) or elsewhere(dest.uri)):
        drop(deps, went, source.uri)  # carried: the old files
    deps.log.warning("a killed move's VM adopted where it runs", extra={
        "vm_id": vm.id, "from": vm.host, "to": dest.name})
    return f"moved to {dest.name}"
