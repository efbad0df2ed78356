"""Holding a task: handle checks, attach (with and without takeover), release.

Every lease change is a transition of the domain `Task` (`attached`,
`taken_over`, `released`) saved with one compare-and-set on the task's lease
generation, so racing callers (threads or replicas) get exactly one winner.
A call that waits on a guest moves its task's activity clock while it waits
(`in_flight`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from rift.contract.tasks import TaskAttachIn, TaskAttachOut, TaskOut, TaskReleaseIn
from rift.domain.clock import iso
from rift.domain.errors import (
    HandleInvalid,
    HandleRequired,
    LeaseStale,
    RateLimited,
    TaskClosed,
    TaskHeld,
    TaskNotFound,
    TaskReleased,
    VmAsleep,
    VmNotFound,
    VmNotRunning,
)
from rift.domain.model import NewEvent, Task, Vm
from rift.domain.records import RateKind
from rift.domain.secrets import Handle, matches
from rift.services.context import Caller, Deps
from rift.services.ports import Store, Tx
from rift.services.read import views

T = TypeVar("T")
_CAS_ATTEMPTS = 8
HOUR = timedelta(hours=1)


def check_rate(tx: Tx, counted: tuple[RateKind, str], what: str, per_hour: int,
               now: datetime) -> None:
    """An hourly budget over the rows of a kind a key made in the last hour
    (``counted``: tasks, VMs or execs and their owner, stale-handle refusals and
    their task): refused with the seconds until the oldest of them leaves the window."""
    kind, key = counted
    window = tx.rates.window(kind, key, now - HOUR)
    if window.count >= per_hour:
        first = window.oldest or now
        raise RateLimited(what, per_hour, max(1, int((first + HOUR - now).total_seconds()) + 1))


def in_write(store: Store, work: Callable[[Tx], T]) -> T:
    """Run ``work`` in one write transaction. A ``LeaseStale`` refusal still
    commits: its ``stale_rejected`` event is the one trace a refusal leaves."""
    stale: LeaseStale | None = None
    with store.write() as tx:
        try:
            return work(tx)
        except LeaseStale as exc:
            stale = exc
    raise stale


def parse_handle(text: str | None) -> Handle:
    if text is None or text == "":
        raise HandleRequired()
    handle = Handle.parse(text) if isinstance(text, str) else None
    if handle is None:
        raise HandleInvalid()
    return handle


def owned_task(tx: Tx, caller: Caller, task_id: str) -> Task:
    """The caller's task; another user's is answered exactly like a missing one."""
    task = tx.tasks.get(task_id)
    if task is None or task.owner != caller.user:
        raise TaskNotFound(task_id)
    return task


def task_vm(tx: Tx, task: Task, vm_id: str, *, running: bool = True) -> Vm:
    """The VM `vm_id` of `task` (another task's is answered like a missing one:
    `vm_not_found`); with `running`, one that runs with no pause, resume or
    snapshot under way (check_running), else `vm_not_running` (naming what it is
    doing)."""
    vm = tx.vms.get(vm_id)
    if vm is None or vm.task_id != task.id:
        raise VmNotFound(vm_id)
    if running:
        check_running(vm)
    return vm


def check_running(vm: Vm) -> None:
    """`vm_not_running` unless the VM runs with no change under way but a move (a
    live migration: it runs meanwhile, SPEC §14); `VmAsleep` (a `vm_not_running`
    that rift.services.lifecycle.sleeps.awake answers by waking it) when it sleeps,
    is going to sleep, or is waking (SPEC §17)."""
    if vm.status == "sleeping" or vm.change in ("falling_asleep", "waking"):
        raise VmAsleep(vm.id, vm.status, doing=vm.change)
    if vm.status != "running" or vm.change not in (None, "moving"):
        raise VmNotRunning(vm.id, vm.status, doing=vm.change)


def ensure_open(task: Task) -> None:
    if not task.is_open:
        raise TaskClosed(task.id, iso(task.closed_at), task.close_reason)


def check_handle(deps: Deps, tx: Tx, caller: Caller, handle: Handle, now: datetime) -> Task:
    """The task this handle holds, touched when a step has passed; refusals as SPEC §4.
    Must run inside a write transaction (it may touch or record a stale event)."""
    task = owned_task(tx, caller, handle.task_id)
    ensure_open(task)
    if task.secret_digest is None:
        raise TaskReleased(task.id)
    if not matches(handle.secret, task.secret_digest):
        # A stale handle leaves an event, within a budget per task (SPEC §15): past
        # it the refusal is rate_limited and writes nothing (the write rolls back).
        check_rate(tx, ("stale_rejected", task.id), f"stale-handle refusals on task {task.id}",
                   deps.limits.rate_stale_per_h, now)
        tx.events.add(NewEvent(task.id, "stale_rejected", now, caller.label,
                               {"holder": task.holder}))
        raise LeaseStale(task.id, task.holder, iso(task.held_since))
    if deps.lease_rules.needs_touch(task, now):
        step = timedelta(seconds=deps.lease_rules.activity_step_s)
        if tx.tasks.touch(task.id, now, now - step):
            task = task.touched(now)
    return task


def hold(deps: Deps, caller: Caller, handle_text: str | None) -> Task:
    """Check a handle for a call that changes nothing else: a read transaction,
    and a write one only when there is something to record (a touch, a stale try)."""
    handle = parse_handle(handle_text)
    now = deps.clock.now()
    with deps.store.read() as tx:
        task = owned_task(tx, caller, handle.task_id)
    quiet_enough = not deps.lease_rules.needs_touch(task, now)
    if task.is_open and quiet_enough and matches(handle.secret, task.secret_digest):
        return task
    return in_write(deps.store, lambda tx: check_handle(deps, tx, caller, handle, now))


def refuse_if_held(deps: Deps, task: Task, now: datetime, takeover: bool) -> bool:
    """Attach's rule, shared by close-by-id and destroy-by-id: free when released
    or quiet, else `takeover` is needed. Answers whether the lease was active."""
    active = deps.lease_rules.lease_is_active(task, now)
    if active and not takeover:
        quiet_at = iso(deps.lease_rules.lease_quiet_at(task)) or ""
        raise TaskHeld(task.id, task.holder, deps.lease_rules.active_ago_s(task, now), quiet_at)
    return active


@dataclass(frozen=True)
class Attached:
    task: Task
    handle: Handle
    previous_holder: str | None


@dataclass(frozen=True)
class Taking:
    """How a lease is taken: when, whether from an active holder, and the event's
    details."""

    now: datetime
    takeover: bool
    details: dict[str, Any]


def take_lease(tx: Tx, caller: Caller, task: Task, taking: Taking) -> Attached | None:
    """Mint a new handle for ``task`` (taken over from an active holder, or
    attached) and save it by compare-and-set; None when another caller won."""
    now, takeover, details = taking.now, taking.takeover, taking.details
    handle = Handle.mint(task.id)
    previous = task.holder if task.is_held else None
    transition = task.taken_over if takeover else task.attached
    won, event = transition(caller.label, handle.digest, now, details)
    if not tx.tasks.save(won, expected_gen=task.lease_gen):
        return None
    tx.events.add(event)
    return Attached(won, handle, previous)


def attach(deps: Deps, caller: Caller, cmd: TaskAttachIn) -> TaskAttachOut:
    """`rift_task_attach`: a new handle for a task of the caller's (taken over from
    an active holder only with `takeover`)."""
    task_id, takeover = cmd.task_id, cmd.takeover
    for _ in range(_CAS_ATTEMPTS):
        now = deps.clock.now()
        with deps.store.write() as tx:
            task = owned_task(tx, caller, task_id)
            ensure_open(task)
            active = refuse_if_held(deps, task, now, takeover)
            won = take_lease(tx, caller, task, Taking(now, active, {"takeover": takeover}))
        if won is not None:
            deps.log.info("task attached", extra={"task_id": task_id, "holder": caller.label,
                                                  "takeover": active})
            return TaskAttachOut(task=views.task_now(deps, won.task.id), handle=str(won.handle),
                                 previous_holder=won.previous_holder)
    # Every compare-and-set lost to other callers: one of them holds it now; say who.
    with deps.store.read() as tx:
        task = owned_task(tx, caller, task_id)
    now = deps.clock.now()
    raise TaskHeld(task_id, task.holder, deps.lease_rules.active_ago_s(task, now),
                   iso(deps.lease_rules.lease_quiet_at(task)) or "")


def release(deps: Deps, caller: Caller, cmd: TaskReleaseIn) -> TaskOut:
    """`rift_task_release`: let go of the handle's task; it stays open."""
    handle = parse_handle(cmd.handle)

    def work(tx: Tx) -> Task | None:
        now = deps.clock.now()
        task = check_handle(deps, tx, caller, handle, now)
        released, event = task.released(caller.label, now)
        if not tx.tasks.save(released, expected_gen=task.lease_gen):
            return None
        tx.events.add(event)
        return released

    for _ in range(_CAS_ATTEMPTS):
        released = in_write(deps.store, work)
        if released is not None:
            return TaskOut(task=views.task_now(deps, released.id))
    raise TaskReleased(handle.task_id)


@contextmanager
def in_flight(deps: Deps, task_id: str | None, wait_s: float) -> Iterator[None]:
    """While the block runs (a call waiting on its guest: an exec, a boot, a fork, a
    wake), move the task's activity clock at its step, as a call made each step
    would: no lease turns quiet and no VM of the task falls asleep under a call in
    flight (SPEC §17). `wait_s`: the longest the block may take; `task_id` None: no
    call of a task's waits (a request to an exposure), nothing moves."""
    step = deps.lease_rules.activity_step_s
    if task_id is None or wait_s < step / 2:
        yield
        return
    done = threading.Event()

    def beat() -> None:
        while not done.wait(step / 2):
            now = deps.clock.now()
            with deps.store.write() as tx:
                tx.tasks.touch(task_id, now, now - timedelta(seconds=step))

    beater = threading.Thread(target=beat, name="rift-in-flight", daemon=True)
    beater.start()
    try:
        yield
    finally:
        done.set()
        beater.join(5)
