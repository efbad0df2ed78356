"""Reconciliation: every domain Rift made matches a live VM row, and no row
lies about a domain. Runs in every sweep and before `rift serve` takes calls.

Race-safe without locks: rows are read before the domain listing to find
domains that vanished (a row already `running` then had its domain before the
listing began), and again after it to find orphans (a domain is made only
after its row exists, so a domain with no live row after the listing is one
nobody will ever account for). A domain whose VM's row is live on another host
is a live migration in flight (`rift host drain --move`), not an orphan; a row
is failed only while it still names the host it was read on (a move that wrote
its new host since took its domain there), and never while it is marked moving
(the drain marks it before the migration begins and clears the mark when it
writes the new host; rift.services.lifecycle.teardown.in_move): between the
switchover and that write its domain is on no host the row names (a mark gone
stale, its drain dead, is settled by where the domain runs: move_marks.adopt).

Pool VMs (rift.services.lifecycle.pools) have rows of their own: their domains and files
are kept while the row is there. Pool rows are read before VM rows, because a
hand-out moves an id from one table to the other in one transaction: read in
that order, a VM is seen in at least one of them.

A live row whose destroy was asked for (`destroy_requested_at`, recorded before
libvirt is) is a destroy that a crash or a libvirt refusal cut short: it is
finished as one (`destroyed`, with its `vm_destroyed` event), never failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from hypervisor.base import DomainRecord, Hypervisor, HypervisorError
from hypervisor.kvm import PROBE_STALE_S, probe_started_at
from rift.domain.errors import HypervisorFailed
from rift.domain.model import Vm, VmStatus
from rift.services.context import SWEEP, Deps, Limits
from rift.services.lifecycle.guest_kinds import vm_files
from rift.services.lifecycle.pauses import settle_change
from rift.services.lifecycle.pool_filler import stale_pool_vms
from rift.services.lifecycle.sleeps import settle_sleep
from rift.services.lifecycle.teardown import destroy_domain, destroy_vm, in_move, vm_ended
from rift.services.lifecycle.volume_settle import settle_attachments
from rift.services.lifecycle.volumes import moved
from rift.services.operator.move_copies import remove_stray_copies
from rift.services.operator.move_marks import LEFT, adopt
from rift.services.ports import Tx

# The default of `RIFT_VM_CREATING_GRACE_S`: longer than any boot wait, so a row
# still `creating` after it is a create whose process died.
CREATING_GRACE_S = Limits.creating_grace_s

FINISHED_DESTROY = {"reason": "finishing a destroy that a crash or a libvirt refusal cut short"}


@dataclass
class ReconcileReport:
    orphans_destroyed: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # VMs of hosts unreachable too long
    stopped: list[str] = field(default_factory=list)
    disks_removed: list[str] = field(default_factory=list)
    destroys_finished: list[str] = field(default_factory=list)
    pool_vms_removed: list[str] = field(default_factory=list)
    changes_settled: list[str] = field(default_factory=list)  # pauses and resumes
    attachments_settled: list[str] = field(default_factory=list)  # cut attaches, detaches
    copies_removed: list[str] = field(default_factory=list)  # a killed move's (move_copies)
    # Each host's domain names as listed, and when the listing began.
    listed: dict[str, tuple[set[str], datetime]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.orphans_destroyed or self.vanished or self.interrupted
                    or self.unreachable or self.lost or self.stopped or self.disks_removed
                    or self.destroys_finished or self.pool_vms_removed
                    or self.changes_settled or self.attachments_settled
                    or self.copies_removed)


def _pool_ids(deps: Deps) -> set[str]:
    with deps.store.read() as tx:
        return tx.pool_vms.ids()


def _live(deps: Deps, host: str) -> dict[str, Vm]:
    with deps.store.read() as tx:
        return {vm.id: vm for vm in tx.fleet.live_on_host(host)}


def _fail(deps: Deps, vm: Vm, expected: VmStatus, error: str) -> bool:
    """Fail the row (compare-and-set on `expected` and on the change it was read
    with), unless its destroy was asked for since it was read: that destroy finishes
    it (the call under way, or the next sweep), so nothing outside Rift is blamed for
    a domain Rift took down. A pause, resume or snapshot begun since the row was read
    wins too: the domain it stops or starts is not a domain lost."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        current = tx.vms.get(vm.id)
        if current is None or current.destroy_requested_at is not None:
            return False
        if in_move(deps, current):  # its domain may be on either host: the move says
            return False
        if current.host != vm.host:  # moved since it was read: its domain is there
            return False
        if (current.status, current.change) != (expected, vm.change):
            return False
        failed, event = current.failed(error, SWEEP, now)
        won = tx.vms.save(failed, current)
        if won:
            tx.events.add(event)
            vm_ended(tx, vm, now, SWEEP)
    return won


def _live_elsewhere(deps: Deps, vm_id: str) -> bool:
    """The VM's row, read after the listing, is live on another host: its domain here
    is a move in flight (`rift host drain --move`, another process). libvirt lists
    the incoming domain on the destination while QEMU streams, and it runs there
    before the drain writes the row's new host. Kept, not an orphan (a move whose
    process died after the switchover: once its mark is stale the source's sweep
    writes the row's new host, rift.services.operator.move_marks.adopt); once the row
    is no longer live the next sweep destroys it."""
    with deps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    return vm is not None and vm.is_live


def reconcile_host(deps: Deps, host: str, uri: str, report: ReconcileReport) -> None:
    before = _live(deps, host)
    hv = deps.hosts.hypervisor(uri)
    listed_at = deps.clock.now()
    try:
        listed: list[DomainRecord] = hv.list_domains()
    except HypervisorError as exc:
        deps.log.warning("host unreachable", extra={"host": host, "error": str(exc)})
        report.unreachable.append(host)
        mark_unreachable(deps, host, str(exc))
        report.lost.extend(lose_vms_of_lost_host(deps, host))
        return
    mark_reachable(deps, host)
    report.listed[host] = ({d.name for d in listed}, listed_at)
    # Only this installation's domains: other control planes may share the host.
    ours = {d.vm_id: d for d in listed if d.vm_id is not None and d.install == deps.install_id}
    pooled = _pool_ids(deps)
    after = _live(deps, host)
    for vm_id, domain in ours.items():
        probed = probe_started_at(domain.task_id, vm_id)
        if probed is not None and time.time() - probed < PROBE_STALE_S:
            continue  # a KVM probe under way (rift.bootstrap.Accelerators)
        if vm_id not in after and vm_id not in pooled and not _live_elsewhere(deps, vm_id):
            try:
                hv.destroy(domain.name)
                report.orphans_destroyed.append(domain.name)
                deps.log.warning("orphan domain destroyed", extra={"domain": domain.name,
                                                                    "host": host})
            except HypervisorError as exc:
                deps.log.warning("orphan destroy refused", extra={"domain": domain.name,
                                                                  "error": str(exc)})
    for vm in before.values():
        _check_row(deps, vm, ours.get(vm.id), uri, report)
    stale = deps.clock.now() - timedelta(seconds=deps.limits.creating_grace_s)
    for vm in after.values():
        if vm.status == "creating" and vm.created_at < stale:
            if vm.destroy_requested_at is not None:
                _finish_destroy(deps, vm, report)
            else:
                _interrupted(deps, vm, hv, vm.id in ours, report)


def _check_running(deps: Deps, vm: Vm, domain: DomainRecord | None, uri: str,
                   report: ReconcileReport) -> None:
    """A `running` row (read before the listing) against its domain in the listing."""
    if vm.destroy_requested_at is not None:
        _finish_destroy(deps, vm, report)
    elif domain is None:
        if _fail(deps, vm, "running", "the domain is gone: it was destroyed or lost "
                 "outside Rift (host restart, virsh)"):
            report.vanished.append(vm.id)
    elif not domain.active:
        _stopped(deps, vm, uri, report)


def _check_row(deps: Deps, vm: Vm, domain: DomainRecord | None, uri: str,
               report: ReconcileReport) -> None:
    """A live row read before the listing, against its domain in the listing."""
    if vm.change is not None:
        _check_changing(deps, vm, domain, uri, report)
    elif vm.status == "running":
        _check_running(deps, vm, domain, uri, report)
    elif vm.status in ("paused", "sleeping"):
        _check_paused(deps, vm, domain, uri, report)


def _check_changing(deps: Deps, vm: Vm, domain: DomainRecord | None, uri: str,
                    report: ReconcileReport) -> None:
    """A pause, resume or move under way for longer than any takes (a crash cut it):
    finished or rolled back by what the domain shows (a move whose domain still runs
    on the row's host is rolled back, one whose domain runs on one other host is
    written as moved there: rift.services.operator.move_marks.adopt); failed when it
    has neither run nor a saved state."""
    if vm.destroy_requested_at is not None:
        _finish_destroy(deps, vm, report)
        return
    if vm.change == "snapshotting":
        return  # its snapshot settles it (rift.services.lifecycle.snapshots.settle_snapshots)
    stale = deps.clock.now() - timedelta(seconds=deps.limits.creating_grace_s)
    if vm.change_at is None or vm.change_at >= stale:
        return  # a change under way now: its call settles it
    gone = domain is None or not (domain.active or domain.saved)
    moved_to = (adopt(deps, vm, None if domain is None else uri)
                if vm.change == "moving" and gone else None)
    if moved_to == LEFT:
        return  # where its domain runs is unclear: a later sweep looks again
    done = moved_to or settle_change(deps, vm, domain)
    if done is not None:
        report.changes_settled.append(vm.id)
        deps.log.warning("vm change settled", extra={"vm_id": vm.id, "done": done})
        return
    _lost_saved_state(deps, vm, domain, uri, report)


def _check_paused(deps: Deps, vm: Vm, domain: DomainRecord | None, uri: str,
                  report: ReconcileReport) -> None:
    """A `paused` row against its domain: stopped with a saved state, as it should be;
    running (started outside Rift) turns the row running; gone, or stopped with no
    saved state, fails it."""
    if vm.destroy_requested_at is not None:
        _finish_destroy(deps, vm, report)
    elif domain is not None and domain.active and vm.status == "sleeping":
        if settle_sleep(deps, vm, True, "its domain was started outside Rift"):
            report.changes_settled.append(vm.id)
    elif domain is not None and domain.active:
        now = deps.clock.now()
        with deps.store.write() as tx:
            current = tx.vms.get(vm.id)
            if current is not None and (current.status, current.change) == ("paused", None):
                resumed, event = current.resumed(SWEEP, now, {
                    "reason": "its domain was started outside Rift"})
                if tx.vms.save(resumed, current):
                    tx.events.add(event)
                    report.changes_settled.append(vm.id)
    elif domain is None or not domain.saved:
        _lost_saved_state(deps, vm, domain, uri, report)


def _lost_saved_state(deps: Deps, vm: Vm, domain: DomainRecord | None, uri: str,
                      report: ReconcileReport) -> None:
    why = ("the domain is gone: it was destroyed or lost outside Rift (host restart, "
           "virsh)" if domain is None else "its saved state is gone: it cannot resume")
    if _fail(deps, vm, vm.status, why):
        report.vanished.append(vm.id)
        if domain is not None:
            _take_down(deps, vm, uri)


def _take_down(deps: Deps, vm: Vm, uri: str) -> None:
    """The domain of a row just failed. The row goes first (by compare-and-set), so a
    pause or resume begun after the listing keeps its domain; a destroy refused here
    leaves the domain an orphan, which the next sweep destroys."""
    try:
        destroy_domain(deps, vm, uri)
    except HypervisorFailed as exc:
        deps.log.warning("destroy of a failed vm refused", extra={"vm_id": vm.id,
                                                                  "error": str(exc)})


def _finish_destroy(deps: Deps, vm: Vm, report: ReconcileReport) -> None:
    """Pool VMs (rift.services.lifecycle.pools) have rows of their own: their domains and files
are kept while the row is there. Pool rows are read before VM rows, because a
hand-out moves an id from one table to the other in one transaction: read in
that order, a VM is seen in at least one of them.

A live row whose destroy was asked for: the destroy a crash (or a libvirt
    refusal) cut short, finished as `rift_vm_destroy` would have (the domain
    destroyed if still there, the row `destroyed` with its event). A destroy
    still under way elsewhere may race this: the compare-and-set on the row's
    status gives one event between them."""
    try:
        done = destroy_vm(deps, vm, SWEEP, FINISHED_DESTROY)
    except HypervisorFailed as exc:
        deps.log.warning("destroy refused", extra={"vm_id": vm.id, "error": exc.message})
        return  # the row stays live; the next sweep tries again
    if done.status == "destroyed":
        report.destroys_finished.append(vm.id)


def _stopped(deps: Deps, vm: Vm, uri: str, report: ReconcileReport) -> None:
    """A `running` row whose domain is shut off (a poweroff inside the guest, a stop
    outside Rift): undefine the domain, fail the row. (A destroy of Rift's own that
    a crash cut off between the stop and the undefine has its request on the row
    and is finished as a destroy instead.)"""
    if _fail(deps, vm, "running", "the guest stopped: its domain was shut off (a poweroff "
             "inside the guest, or a stop outside Rift)"):
        report.stopped.append(vm.id)
        _take_down(deps, vm, uri)


def _unreachable_note(host: str) -> str:
    return f"host {host} does not answer"


def mark_unreachable(deps: Deps, host: str, error: str) -> None:
    """The host takes no new VMs, and its live VMs say why they may not answer;
    nothing else stops."""
    now = deps.clock.now()
    note = f"{_unreachable_note(host)} since {now.isoformat(timespec='seconds')}: {error}"
    with deps.store.write() as tx:
        current = tx.hosts.get(host, lock=True)
        if current is None or current.unreachable_since is not None:
            return
        tx.hosts.save(current.unreachable(now, error), current)
        moved(tx)  # its volumes' views say so: the Boxes pages read again
        for vm in tx.fleet.live_on_host(host):
            if vm.error is None:
                _note(tx, vm, note)


def _note(tx: Tx, vm: Vm, error: str | None) -> None:
    """The VM's `error` says why it may not answer, or no longer (where its status is
    still as listed: the row is read locked, so the note is saved against it)."""
    current = tx.vms.get(vm.id, lock=True)
    if current is not None and current.status == vm.status:
        tx.vms.save(current.noted(error), current)


def lose_vms_of_lost_host(deps: Deps, host: str) -> list[str]:
    """Past `RIFT_HOST_LOST_S` of silence, the host's live VMs are `failed` (host
    lost), each with its event, and no longer hold its capacity. Their domains may
    still run there: if the host comes back, they are orphans of failed rows, and
    its first reconciliation destroys them (and nothing else). A VM a killed drain
    moved off it (stale `moving`) that runs on another host is adopted there."""
    with deps.store.read() as tx:
        current = tx.hosts.get(host)
        vms = tx.fleet.live_on_host(host)
    since = current.unreachable_since if current is not None else None
    if since is None:
        return []
    silent_s = (deps.clock.now() - since).total_seconds()
    if silent_s < deps.limits.host_lost_s:
        return []
    error = (f"host lost: {host} has not answered since {since.isoformat(timespec='seconds')} "
             f"(over {deps.limits.host_lost_s} s, RIFT_HOST_LOST_S)")
    lost = [vm.id for vm in vms  # a killed move's VM running elsewhere is adopted there
            if not (vm.change == "moving" and not in_move(deps, vm) and adopt(deps, vm))
            and _fail(deps, vm, vm.status, error)]
    if lost:
        deps.log.warning("host lost: its VMs failed", extra={"host": host, "vms": len(lost)})
    return lost


def mark_reachable(deps: Deps, host: str) -> None:
    with deps.store.read() as tx:
        current = tx.hosts.get(host)
    if current is None or current.unreachable_since is None:
        return
    with deps.store.write() as tx:
        current = tx.hosts.get(host, lock=True)
        if current is not None and current.unreachable_since is not None:
            tx.hosts.save(current.reachable(), current)
            moved(tx)
        for vm in tx.fleet.live_on_host(host):
            if vm.error is not None and vm.error.startswith(_unreachable_note(host)):
                _note(tx, vm, None)
    deps.log.info("host answers again", extra={"host": host})


def _interrupted(deps: Deps, vm: Vm, hv: Hypervisor, has_domain: bool,
                 report: ReconcileReport) -> None:
    """A create that never finished (its process died): take the domain down, fail the row."""
    if has_domain:
        try:
            hv.destroy(vm.domain_name)
        except HypervisorError:
            return  # the next sweep tries again; the row stays live meanwhile
    if _fail(deps, vm, "creating", "interrupted: the control plane stopped while creating it"):
        report.interrupted.append(vm.id)


def reconcile(deps: Deps) -> ReconcileReport:
    report = ReconcileReport()
    with deps.store.read() as tx:
        hosts = tx.hosts.all()
    for host in hosts:
        reconcile_host(deps, host.name, host.uri, report)
    report.pool_vms_removed = stale_pool_vms(deps, report.listed)
    report.attachments_settled = settle_attachments(deps)
    report.copies_removed = remove_stray_copies(deps)
    remove_dead_disks(deps, report)
    if report:
        deps.log.info("reconciled", extra={
            "orphans_destroyed": len(report.orphans_destroyed), "vanished": len(report.vanished),
            "destroys_finished": len(report.destroys_finished),
            "stopped": len(report.stopped), "disks_removed": len(report.disks_removed),
            "interrupted": len(report.interrupted), "unreachable": report.unreachable,
            "lost": len(report.lost),
            "pool_vms_removed": len(report.pool_vms_removed),
            "changes_settled": len(report.changes_settled),
            "attachments_settled": len(report.attachments_settled),
            "copies_removed": len(report.copies_removed)})
    return report


def remove_dead_disks(deps: Deps, report: ReconcileReport) -> None:
    """Delete the files (overlays, seeds, serial logs) of VMs with no live row that
    have disks: those a crash, an orphan's destroy or a vanished domain left behind.
    Files are listed before rows are read, and a row is live before its files are
    made, so a VM being created keeps its files."""
    files = vm_files(deps)
    found = files.with_disks()
    if not found:
        return
    pooled = _pool_ids(deps)
    with deps.store.read() as tx:
        dead = sorted(vm_id for vm_id in found - pooled
                      if (vm := tx.vms.get(vm_id)) is None or not vm.is_live)
    for vm_id in dead:
        files.remove(vm_id)
        report.disks_removed.append(vm_id)
