"""The engine's record of a VM's code contexts (SPEC §20; rift.domain.code_contexts):
written when a context is made, run, restarted or deleted, synced with what the
guest lists, and gone with its VM. The VM's view and the Boxes page read it; the
sleep sweep counts its runs in flight as it counts running execs (SPEC §17: a VM
with one stays awake unless its task says `sleep: "always"`), asking the guest
first whether they still run (`settle`), since a run that went on past its call
may have ended unread.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from rift.contract.code import ContextView, ExecutionView
from rift.domain.code_contexts import (
    DEFAULT,
    INTERRUPT_GRACE_S,
    MARK_KEY,
    CodeContext,
    RunEnd,
    RunStart,
)
from rift.domain.errors import GuestUnreachable
from rift.domain.model import Vm
from rift.services.context import Deps
from rift.services.ports import Tx
from rift.services.ports.code import CodeRequest, NoPython
from rift.services.read import code_views

RUN_SLACK_S = 60  # past a run's timeout and grace: a kernel started anew under it
SETTLE_S = 3.0  # the sweep's look at one guest's contexts


def changed(tx: Tx) -> None:
    """Tell the Boxes pages a VM's contexts changed (a new token under MARK_KEY)."""
    tx.meta.swap(MARK_KEY, tx.meta.get(MARK_KEY), secrets.token_hex(6))


def run_begun(tx: Tx, vm: Vm, run: RunStart, now: datetime) -> None:
    """In the transaction that checked the call: the run is in flight, ending at the
    latest after the runs queued before it and its own timeout. The default context
    is recorded on its first run; another context Rift has no row of (made before
    Rift kept them, or in a fork's source) is recorded when the guest answers."""
    found = tx.code_contexts.get(vm.id, run.context_id)
    if found is None and run.context_id != DEFAULT:
        return
    start = now
    if found is not None and found.run_until is not None and found.running_at(now) \
            and found.run_id != run.run_id:
        start = found.run_until  # queued behind it
    until = start + timedelta(seconds=run.timeout_s + INTERRUPT_GRACE_S + RUN_SLACK_S)
    if found is None:
        tx.code_contexts.put(replace(_new(vm, DEFAULT, now), run_id=run.run_id,
                                     run_until=until))
    else:
        tx.code_contexts.run_started(vm.id, run.context_id, run.run_id, until)
    changed(tx)


def run_seen(deps: Deps, vm: Vm, view: ExecutionView, timeout_s: int | None = None) -> None:
    """A run as a call saw it: its end recorded (last run, execution count, status)
    once it ended; one still running recorded in flight where Rift had no row of
    its context."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        found = tx.code_contexts.get(vm.id, view.context_id)
        if view.status == "running":
            if found is None or found.run_id is None:
                until = now + timedelta(seconds=(timeout_s or 86_400) + INTERRUPT_GRACE_S
                                        + RUN_SLACK_S)
                tx.code_contexts.put(replace(found or _new(vm, view.context_id, now),
                                             run_id=view.run_id, run_until=until))
                changed(tx)
            return
        if found is None:
            tx.code_contexts.put(_new(vm, view.context_id, now))
        tx.code_contexts.run_ended(vm.id, view.context_id, RunEnd(
            view.run_id, now, view.execution_count, view.status))
        changed(tx)


def run_refused(deps: Deps, vm: Vm, context_id: str, run_id: str) -> None:
    """A run the guest refused (no python3, no such context): not in flight; a
    default context it alone recorded, never run, goes."""
    with deps.store.write() as tx:
        found = tx.code_contexts.get(vm.id, context_id)
        if found is None or found.run_id != run_id:
            return
        if found.id == DEFAULT and found.last_run_at is None:
            tx.code_contexts.remove(vm.id, found.id)
        else:
            tx.code_contexts.put(replace(found, run_id=None, run_until=None))
        changed(tx)


def forked(tx: Tx, source_id: str, fork: Vm, as_of: datetime | None = None) -> None:
    """A fork starts with its source's contexts (its memory holds their kernels): their
    rows copied to it, so its view lists them at once, each with its last run; a run
    the source had in flight is not counted as the fork's (the next list asks the
    fork's guest). A fork of a snapshot taken `as_of` then gets the contexts made by
    then, a last run since not counted (its next run or list tells the fork's own);
    none where the source VM is gone (its first run or list finds them)."""
    for row in tx.code_contexts.of_vms([source_id])[source_id]:
        if as_of is not None and row.created_at > as_of:
            continue  # made after the snapshot: not in its memory
        then = row
        if as_of is not None and row.last_run_at is not None and row.last_run_at > as_of:
            then = replace(row, last_run_at=None, execution_count=None, last_status=None)
        tx.code_contexts.put(replace(then, vm_id=fork.id, task_id=fork.task_id, run_id=None,
                                     run_until=None))
        changed(tx)


def made(deps: Deps, vm: Vm, view: ContextView) -> None:
    """A context made, or started anew (restarted): no run, no count."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        found = tx.code_contexts.get(vm.id, view.id)
        fresh = CodeContext(vm_id=vm.id, id=view.id, task_id=vm.task_id,
                            language=view.language, cwd=view.cwd, created_at=now)
        tx.code_contexts.put(fresh if found is None else replace(
            found, language=view.language, cwd=view.cwd, execution_count=None,
            last_status=None, run_id=None, run_until=None))
        changed(tx)


def deleted(deps: Deps, vm: Vm, context_id: str) -> None:
    with deps.store.write() as tx:
        if tx.code_contexts.remove(vm.id, context_id):
            changed(tx)


def synced(deps: Deps, vm: Vm, listed: Sequence[ContextView]) -> None:
    """What the guest lists is what there is: contexts Rift had no row of added,
    rows of contexts the guest no longer has (a reboot, a delete elsewhere) gone,
    and a run the guest no longer runs no longer in flight."""
    now = deps.clock.now()
    seen = {x.id: x for x in listed}
    with deps.store.write() as tx:
        rows = {x.id: x for x in tx.code_contexts.of_vms([vm.id])[vm.id]}
        moved = False
        for gone in set(rows) - set(seen):
            tx.code_contexts.remove(vm.id, gone)
            moved = True
        for one in listed:
            row = rows.get(one.id)
            if row is None:
                tx.code_contexts.put(replace(_new(vm, one.id, now), language=one.language,
                                             cwd=one.cwd, run_id=one.running,
                                             run_until=now + timedelta(days=1)
                                             if one.running else None))
                moved = True
            elif row.run_id is not None and one.running != row.run_id:
                tx.code_contexts.put(replace(row, run_id=None, run_until=None))
                moved = True
        if moved:
            changed(tx)


def busy(tx: Tx, vm_id: str, now: datetime) -> bool:
    """A run in flight in one of the VM's contexts (the sleep sweep's check)."""
    return any(x.running_at(now) for x in tx.code_contexts.of_vms([vm_id])[vm_id])


def settle(deps: Deps, vm: Vm) -> None:
    """Before the sweep puts a VM to sleep: where Rift holds a run in flight, ask the
    guest (within SETTLE_S) which still run. A guest that does not answer keeps
    the runs counted until their bound."""
    now = deps.clock.now()
    with deps.store.read() as tx:
        if not busy(tx, vm.id, now):
            return
    try:
        answer = deps.code.request(vm, CodeRequest(method="GET", path="/contexts",
                                                   timeout_s=SETTLE_S))
        if answer.status != 200:
            return
        synced(deps, vm, code_views.contexts(vm.id, answer.body))
    except (GuestUnreachable, NoPython) as exc:
        deps.log.info("code contexts not settled", extra={"vm_id": vm.id,
                                                         "error": str(exc)[:200]})


def expire(deps: Deps) -> int:
    """The sweep's part: runs in flight past their bound no longer count."""
    with deps.store.write() as tx:
        gone = tx.code_contexts.expire_runs(deps.clock.now())
        if gone:
            changed(tx)
        return gone


def end_for_vm(tx: Tx, vm: Vm, now: datetime, actor: str) -> None:
    """In the transaction that ends the VM: its contexts go (the kernels went with
    its guest)."""
    if tx.code_contexts.remove(vm.id):
        changed(tx)


def _new(vm: Vm, context_id: str, now: datetime) -> CodeContext:
    return CodeContext(vm_id=vm.id, id=context_id, task_id=vm.task_id, language="python",
                       cwd=None, created_at=now)
