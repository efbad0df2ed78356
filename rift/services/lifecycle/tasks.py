"""Task use cases: new, get, list, events, close (by handle, by id, by the operator)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from rift.contract.operator import TaskIdIn
from rift.contract.tasks import (
    TaskCloseIn,
    TaskCloseOut,
    TaskEventsIn,
    TaskEventsOut,
    TaskGetIn,
    TaskListIn,
    TaskListOut,
    TaskNewIn,
    TaskNewOut,
    TaskOut,
)
from rift.contract.views import TaskView
from rift.domain.errors import (
    IdempotencyConflict,
    InvalidArgument,
    QuotaExceeded,
    TaskClosed,
    TaskNotFound,
)
from rift.domain.ids import new_task_id
from rift.domain.model import NewEvent, Task, Vm
from rift.domain.secrets import Handle
from rift.domain.store_errors import DuplicateKey
from rift.services.context import OPERATOR, Caller, Deps
from rift.services.lifecycle.leases import (
    Attached,
    Taking,
    check_handle,
    check_rate,
    ensure_open,
    hold,
    in_write,
    owned_task,
    parse_handle,
    refuse_if_held,
    take_lease,
)
from rift.services.lifecycle.snapshots import remove_task_snapshots
from rift.services.lifecycle.teardown import Closing, close_in_tx, destroy_vms, forget_task_key
from rift.services.ports import Tx
from rift.services.read import views


def request_digest(**fields: Any) -> str:
    """What an idempotency key is bound to: the call's other input."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _replay(deps: Deps, tx: Tx, caller: Caller, task: Task, digest: str) -> Attached | None:
    """A repeated keyed create: same input gets the task with a fresh handle (the
    first answer may never have arrived); other input is a conflict."""
    if task.request_digest != digest:
        raise IdempotencyConflict("rift_task_new")
    ensure_open(task)
    return take_lease(tx, caller, task, Taking(deps.clock.now(), False, {"replay": True}))


def new(deps: Deps, caller: Caller, cmd: TaskNewIn) -> TaskNewOut:
    """`rift_task_new`: open a task held by the caller (a repeated key replays it)."""
    name, idempotency_key = cmd.name, cmd.idempotency_key
    # The sleep options are in the digest only when given: a key's digest from before
    # they existed still matches.
    sleeps = {k: v for k, v in (("sleep_after_s", cmd.sleep_after_s), ("sleep", cmd.sleep))
              if v is not None and (k, v) != ("sleep", "idle")}
    digest = request_digest(name=name, **sleeps)
    for _ in range(3):
        now = deps.clock.now()
        try:
            with deps.store.write() as tx:
                if idempotency_key is not None:
                    existing = tx.tasks.find_by_key(caller.user, idempotency_key)
                    if existing is not None:
                        won = _replay(deps, tx, caller, existing, digest)
                        if won is None:
                            continue
                        return TaskNewOut(task=views.task(deps, tx, won.task),
                                          handle=str(won.handle))
                _check_task_budget(deps, tx, caller, now)
                task_id = new_task_id()
                handle = Handle.mint(task_id)
                task = Task(
                    id=task_id, owner=caller.user, name=name or "untitled", status="open",
                    lease_gen=1, secret_digest=handle.digest, holder=caller.label,
                    held_since=now, last_activity_at=now, created_at=now,
                    idempotency_key=idempotency_key, request_digest=digest,
                    sleep_after_s=cmd.sleep_after_s, sleep=cmd.sleep,
                )
                tx.tasks.add(task)
                tx.events.add(NewEvent(task_id, "opened", now, caller.label,
                                       {"name": task.name, "holder": caller.label}))
                opened = TaskNewOut(task=views.task_of(deps, task), handle=str(handle))
        except DuplicateKey:
            continue  # a concurrent create with the same key won; replay it
        deps.log.info("task opened", extra={"task_id": task_id, "holder": caller.label})
        return opened
    raise IdempotencyConflict("rift_task_new")


def _check_task_budget(deps: Deps, tx: Tx, caller: Caller, now: datetime) -> None:
    limits = deps.limits
    if tx.tasks.count_open(caller.user) >= limits.max_open_tasks:
        raise QuotaExceeded(f"open tasks per user ({limits.max_open_tasks})",
                            limits.max_open_tasks, "rift_task_close")
    check_rate(tx, ("tasks", caller.user), "task creations", limits.rate_task_new_per_h, now)


def get(deps: Deps, caller: Caller, cmd: TaskGetIn) -> TaskOut:
    """`rift_task_get`: a task's view; with a handle this is a touch (activity on it)."""
    if cmd.handle is not None:
        task = hold(deps, caller, cmd.handle)
        with deps.store.read() as tx:
            return TaskOut(task=views.task(deps, tx, tx.tasks.get(task.id) or task))
    if cmd.task_id is None:
        raise InvalidArgument("task_id", "give task_id or handle")
    with deps.store.read() as tx:
        return TaskOut(task=views.task(deps, tx, owned_task(tx, caller, cmd.task_id)))


def list_tasks(deps: Deps, caller: Caller | None, cmd: TaskListIn) -> TaskListOut:
    """`rift_task_list`: the caller's tasks, newest first (``caller=None``: every
    user's, for operators)."""
    size = cmd.limit
    with deps.store.read() as tx:
        page = tx.tasks.page(caller.user if caller else None, cmd.status, size + 1, cmd.after)
        more = len(page) > size
        page = page[:size]
        shown = views.tasks(deps, tx, page)
    return TaskListOut(tasks=shown, next_after=page[-1].id if more and page else None)


def events(deps: Deps, caller: Caller | None, cmd: TaskEventsIn) -> TaskEventsOut:
    """`rift_task_events`: a task's event log from `after_id` on."""
    task_id, start, size = cmd.task_id, cmd.after_id, cmd.limit
    with deps.store.read() as tx:
        task = tx.tasks.get(task_id)
        if task is None or (caller is not None and task.owner != caller.user):
            raise TaskNotFound(task_id)
        found = tx.events.page(task_id, start, size + 1)
    more = len(found) > size
    found = found[:size]
    return TaskEventsOut(task_id=task_id, events=[views.event(e) for e in found],
                         next_after=found[-1].id if found else start, has_more=more)


def _finish_close(deps: Deps, task_id: str, actor: str) -> TaskCloseOut:
    with deps.store.read() as tx:
        vms: list[Vm] = tx.vms.of_task(task_id)
    destroyed, refused = destroy_vms(deps, vms, actor)
    if not refused:
        forget_task_key(deps, task_id)
    remove_task_snapshots(deps, task_id, actor)
    with deps.store.read() as tx:
        task = tx.tasks.get(task_id)
        assert task is not None
        deps.log.info("task closed", extra={"task_id": task_id, "actor": actor,
                                            "reason": task.close_reason})
        return TaskCloseOut(task=views.task(deps, tx, task), destroyed=destroyed)


def close(deps: Deps, caller: Caller, cmd: TaskCloseIn) -> TaskCloseOut:
    """`rift_task_close`: by handle, or by id under attach's rules; its VMs are destroyed."""
    handle, task_id, takeover = cmd.handle, cmd.task_id, cmd.takeover
    if handle is None and task_id is None:
        raise InvalidArgument("handle", "give handle, or task_id (+ takeover)")
    if handle is not None:
        parsed = parse_handle(handle)

        def by_handle(tx: Tx) -> bool:
            now = deps.clock.now()
            task = check_handle(deps, tx, caller, parsed, now)
            return close_in_tx(tx, task, Closing(caller.label, "closed", now))

        target = parsed.task_id
        closed = _retry(lambda: in_write(deps.store, by_handle))
    else:
        assert task_id is not None
        target = task_id

        def by_id(tx: Tx) -> bool:
            now = deps.clock.now()
            task = owned_task(tx, caller, target)
            ensure_open(task)
            refuse_if_held(deps, task, now, takeover)
            return close_in_tx(tx, task, Closing(caller.label, "closed", now,
                                                 {"takeover": takeover}))

        closed = _retry(lambda: in_write(deps.store, by_id))
    if not closed:
        raise TaskClosed(target, None, None)
    return _finish_close(deps, target, caller.label)


def operator_view(deps: Deps, cmd: TaskIdIn) -> TaskView:
    """`rift task show ID`: any user's task, for the local operator."""
    task_id = cmd.task_id
    with deps.store.read() as tx:
        task = tx.tasks.get(task_id)
        if task is None:
            raise TaskNotFound(task_id)
        return views.task(deps, tx, task)


def close_as_operator(deps: Deps, cmd: TaskIdIn) -> TaskCloseOut:
    """`rift task close ID`: the local operator closes any task, reason `operator`."""
    task_id = cmd.task_id
    details = {"by": cmd.by} if cmd.by else {}

    def work(tx: Tx) -> bool:
        task = tx.tasks.get(task_id)
        if task is None:
            raise TaskNotFound(task_id)
        ensure_open(task)
        return close_in_tx(tx, task, Closing(OPERATOR, "operator", deps.clock.now(), details))

    if not _retry(lambda: in_write(deps.store, work)):
        raise TaskClosed(task_id, None, None)
    return _finish_close(deps, task_id, OPERATOR)


def _retry(attempt: Any) -> bool:
    """Repeat a compare-and-set that lost to a concurrent change (each try re-reads)."""
    return any(attempt() for _ in range(8))
