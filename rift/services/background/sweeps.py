"""The sweep: close idle tasks, finish interrupted closes, purge old tombstones,
put quiet tasks' VMs to sleep (rift.services.lifecycle.sleeps).

Ordinary service functions, idempotent: every replica may run them at once;
each close is a compare-and-set, so a task closes once with one event. The
idle scan is an indexed range on `(status, last_activity_at)`: O(tasks due).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from rift.domain.ids import is_pool_id, is_vm_id
from rift.domain.model import Vm
from rift.services.background.heartbeat import beat
from rift.services.background.reconcile import ReconcileReport, reconcile
from rift.services.context import SWEEP, Deps
from rift.services.lifecycle import code_records
from rift.services.lifecycle.exec_ends import record_ends
from rift.services.lifecycle.sleeps import sleep_quiet
from rift.services.lifecycle.snapshot_files import dead_snapshot_files
from rift.services.lifecycle.snapshots import settle_snapshots
from rift.services.lifecycle.teardown import (
    Closing,
    close_in_tx,
    destroy_vms,
    forget_task_key,
    in_move,
)

BATCH = 200


@dataclass
class SweepReport:
    closed: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    purged: int = 0
    keys_forgotten: int = 0
    execs_ended: list[str] = field(default_factory=list)
    reconciled: ReconcileReport = field(default_factory=ReconcileReport)
    snapshots_settled: list[str] = field(default_factory=list)
    slept: list[str] = field(default_factory=list)


def close_idle(deps: Deps, report: SweepReport) -> None:
    """Close every open task quiet for `RIFT_TASK_IDLE_S` (reason `idle`)."""
    while True:
        now = deps.clock.now()
        cutoff = deps.lease_rules.idle_cutoff(now)
        closed_now: list[str] = []
        with deps.store.write() as tx:
            due = tx.tasks.due_idle(cutoff, BATCH)
            for task in due:
                details = {"quiet_s": int((now - task.last_activity_at).total_seconds())}
                if close_in_tx(tx, task, Closing(SWEEP, "idle", now, details)):
                    closed_now.append(task.id)
        report.closed.extend(closed_now)
        if len(due) < BATCH:
            return


def finish_closing(deps: Deps, report: SweepReport) -> None:
    """Destroy live VMs of closed tasks: a close interrupted by a crash, or a
    destroy libvirt refused, is finished here."""
    while True:
        with deps.store.read() as tx:
            vms: list[Vm] = tx.fleet.live_of_closed_tasks(BATCH)
        # one being moved is destroyed once its row names the host its domain is on
        done, refused = destroy_vms(deps, [vm for vm in vms if not in_move(deps, vm)], SWEEP)
        for task_id in {vm.task_id for vm in vms if vm.id in done}:
            with deps.store.read() as tx:
                if tx.vms.count_live(task_id) == 0:
                    forget_task_key(deps, task_id)
        report.destroyed.extend(done)
        report.refused.extend(refused)
        if len(vms) < BATCH or not done:
            return


def purge_closed(deps: Deps, report: SweepReport) -> None:
    """Drop tombstones older than `RIFT_CLOSED_RETENTION_S`."""
    cutoff = deps.clock.now() - timedelta(seconds=deps.limits.closed_retention_s)
    while True:
        with deps.store.write() as tx:
            gone = tx.tasks.purge_closed_before(cutoff, BATCH)
        for task_id in gone:
            forget_task_key(deps, task_id)
        report.purged += len(gone)
        if len(gone) < BATCH:
            return


def forget_unneeded_keys(deps: Deps, report: SweepReport) -> None:
    """A task's key pair goes once the task is closed with no live VM (or gone):
    a task closed for being idle with no VM, a close a crash cut before its key
    went, a key a crash left half written. A pool's key goes with its pool, a
    VM's boot key (its pool's or its snapshot image's, under its id) with the VM:
    a pooled VM of a snapshot image logs in with it before it is handed out."""

    def needed(task_id: str) -> bool:
        with deps.store.read() as tx:
            if is_pool_id(task_id):  # a pool's key: needed while the pool is there
                return tx.pools.get(task_id) is not None
            if is_vm_id(task_id):  # a VM's boot key: while it lives, pooled or handed out
                vm = tx.vms.get(task_id)
                return (vm is not None and vm.is_live) or tx.pool_vms.get(task_id) is not None
            task = tx.tasks.get(task_id)
            return task is not None and (task.is_open or tx.vms.count_live(task_id) > 0)

    report.keys_forgotten = deps.guests.keys.tidy_keys(needed)


def sweep(deps: Deps) -> SweepReport:
    report = SweepReport()
    close_idle(deps, report)
    finish_closing(deps, report)
    purge_closed(deps, report)
    forget_unneeded_keys(deps, report)
    report.reconciled = reconcile(deps)
    report.snapshots_settled = settle_snapshots(deps) + dead_snapshot_files(deps)
    report.execs_ended = record_ends(deps)
    code_records.expire(deps)
    report.slept = sleep_quiet(deps)
    beat(deps)
    if report.closed or report.destroyed or report.purged or report.refused:
        deps.log.info("sweep", extra={"closed": len(report.closed),
                                      "destroyed": len(report.destroyed),
                                      "refused": len(report.refused), "purged": report.purged})
    return report
