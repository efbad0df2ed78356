"""Snapshots and forks through the E2B door (SPEC §12, §16), as engine use cases.
Blocking: the routes run these in worker threads.

- **A snapshot** (`POST /sandboxes/{id}/snapshots`) is `rift_vm_snapshot` of the
  sandbox's VM with its handle (the holder's, or taken over as pause does): it
  belongs to the sandbox's task. Its E2B id is its Rift id (`snap_…`), its
  `names` its name. `GET /snapshots` lists the snapshots of the caller's open
  tasks (by `sandboxID`, by `name` or id, paged); `DELETE /templates/{id}` is
  `rift_vm_snapshot_delete`. A snapshot outlives its sandbox: `kill` of a
  sandbox that has one destroys its VM and leaves its task open, keeping its
  snapshots until they are deleted (the last one closes the task) or Rift's
  rule for idle tasks closes it (`RIFT_TASK_IDLE_S`).
- **A sandbox from a snapshot** (`Sandbox.create(<snapshot id>)`) is a task of its
  own with one VM forked from it (rift.e2b.forking).
- **A fork** (`POST /sandboxes/{id}/fork`, `count` 1 to 20) snapshots the sandbox,
  starts each fork as a sandbox from that snapshot (a task of its own each, at
  once), and deletes the snapshot. Each fork succeeds or fails alone (E2B's
  `[{sandbox} | {error}]`); its metadata and envVars are its source's.
"""

from __future__ import annotations

import threading
from contextlib import suppress
from dataclasses import replace
from datetime import timedelta
from typing import Any

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.snapshots import VmSnapshotDeleteIn, VmSnapshotIn
from rift.contract.views import SnapshotView, TaskView, VmView
from rift.domain.errors import InvalidArgument, RiftError, SnapshotNotFound, TaskClosed
from rift.domain.sandboxes import Sandbox
from rift.domain.secrets import digest
from rift.e2b import shapes
from rift.e2b.forking import start_fork
from rift.e2b.lifecycle import held_handle
from rift.e2b.sandboxes import (
    LIVE,
    TASK_PREFIX,
    Registry,
    answer,
    live_vm,
    new_traffic_token,
    stored,
    timeout_of,
)
from rift.services.context import Caller, Deps
from rift.services.lifecycle import leases, snapshots, tasks

MAX_FORKS = 20  # as E2B's API
MAX_LIST = 100


def _info(snap: SnapshotView) -> dict[str, Any]:
    """E2B's `SnapshotInfo`."""
    return {"snapshotID": snap.id, "names": [snap.name]}


# -- snapshots -----------------------------------------------------------------------------

def create(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
           body: dict[str, Any]) -> dict[str, Any]:
    """POST /sandboxes/{id}/snapshots: the sandbox's memory and disk as of now (it runs
    on). `memory: false` (E2B's filesystem-only) is kept with memory too: a sandbox
    made from it starts where the snapshot was, processes and all."""
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidArgument("name", "a string")
    vm = live_vm(deps, caller, sandbox)
    handle = held_handle(deps, registry, caller, sandbox, vm)
    made = snapshots.make(deps, caller, command(VmSnapshotIn, handle=handle, vm_id=vm.id,
                                                name=name or None))
    return _info(made.snapshot)


def _open_tasks(deps: Deps, caller: Caller) -> list[TaskView]:
    found: list[TaskView] = []
    after: str | None = None
    while True:
        page = tasks.list_tasks(deps, caller, command(c.TaskListIn, status="open", limit=50,
                                                      after=after))
        found.extend(page.tasks)
        if page.next_after is None:
            return found
        after = page.next_after


def _named(snap: SnapshotView, name: str) -> bool:
    """E2B's name filter: the name or id, with or without a `:tag` (Rift has none)."""
    bare = name.rsplit(":", 1)[0] if ":" in name else name
    return bare in (snap.name, snap.id) or name in (snap.name, snap.id)


def listing(deps: Deps, registry: Registry, caller: Caller, query: dict[str, str],
            ) -> tuple[list[dict[str, Any]], str | None]:
    """GET /snapshots: the snapshots of the caller's open tasks (newest task first),
    of one sandbox (`sandboxID`) or name (`name`) when asked; `nextToken` is the last
    snapshot answered."""
    limit_text = query.get("limit", str(MAX_LIST))
    if not limit_text.isdigit() or not 0 < int(limit_text) <= MAX_LIST:
        raise InvalidArgument("limit", f"1–{MAX_LIST}")
    limit = int(limit_text)
    sandbox, name = query.get("sandboxID"), query.get("name")
    vm_id = shapes.vm_id(sandbox) if sandbox else None
    if sandbox and vm_id is None:
        return [], None
    after = query.get("nextToken") or None
    found: list[SnapshotView] = []
    for task in _open_tasks(deps, caller):
        for snap in task.snapshots:
            if after is not None:
                after = None if snap.id == after else after
                continue
            if (vm_id is None or snap.vm_id == vm_id) and (not name or _named(snap, name)):
                found.append(snap)
    page = found[:limit]
    return [_info(s) for s in page], page[-1].id if len(found) > limit else None


def _task_handle(deps: Deps, registry: Registry, caller: Caller, task: TaskView) -> str:
    """A handle on a task of the caller's: its sandbox's (shared or taken over, as
    pause does), or, for a task whose sandbox was killed, the task taken over."""
    for vm in task.vms:
        if vm.status in LIVE:
            return held_handle(deps, registry, caller, shapes.sandbox_id(vm.id), vm)
    return leases.attach(deps, caller, c.TaskAttachIn(task_id=task.id, takeover=True)).handle


def delete(deps: Deps, registry: Registry, caller: Caller, snapshot_id: str) -> None:
    """DELETE /templates/{id}: the caller's snapshot and its files (404 for any other);
    a task the door keeps only for its snapshots closes with its last one."""
    for task in _open_tasks(deps, caller):
        if any(s.id == snapshot_id for s in task.snapshots):
            handle = _task_handle(deps, registry, caller, task)
            snapshots.delete(deps, caller, command(VmSnapshotDeleteIn, handle=handle,
                                                   snapshot_id=snapshot_id))
            _close_if_kept_for_nothing(deps, caller, handle)
            return
    raise SnapshotNotFound(snapshot_id)


def _close_if_kept_for_nothing(deps: Deps, caller: Caller, handle: str) -> None:
    task = tasks.get(deps, caller, command(c.TaskGetIn, handle=handle)).task
    if task.name.startswith(TASK_PREFIX) and not task.snapshots and \
            not any(vm.status in LIVE for vm in task.vms):
        with suppress(TaskClosed):
            tasks.close(deps, caller, command(c.TaskCloseIn, handle=handle))


# -- forks ---------------------------------------------------------------------------------

def _remember(deps: Deps, registry: Registry, handle: str, vm: VmView,
              like: Sandbox) -> dict[str, Any]:
    """A fork's sandbox record (`like`'s settings: its source's, with the fork's end) and
    a traffic token of its own; answers E2B's `Sandbox`."""
    sandbox, traffic = shapes.sandbox_id(vm.id), new_traffic_token()
    now = deps.clock.now()
    assert like.end_at is not None
    record = replace(like, vm_id=vm.id, task_id=vm.task_id, started_at=now,
                     end_at=now + (like.end_at - like.started_at),
                     traffic_digest=digest(traffic))
    with deps.store.write() as tx:
        tx.sandboxes.add(record)
    registry.hold(sandbox, handle, traffic)
    return answer(registry, sandbox, record.template, handle, traffic)


def _count(value: Any) -> int:
    if value is None:
        return 1
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_FORKS:
        raise InvalidArgument("count", f"a whole number of forks, 1–{MAX_FORKS}")
    return value


def _error(err: BaseException) -> dict[str, Any]:
    if isinstance(err, RiftError):
        return shapes.error_body(shapes.status_of(err), shapes.message_of(err))
    return shapes.error_body(500, f"the fork failed: {type(err).__name__}")


def fork(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
         body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /sandboxes/{id}/fork: `count` sandboxes from a snapshot of this one taken
    now (deleted after), started at once; one `{sandbox}` or `{error}` each."""
    count = _count(body.get("count"))
    timeout = timeout_of(body.get("timeout"))
    vm = live_vm(deps, caller, sandbox)
    handle = held_handle(deps, registry, caller, sandbox, vm)
    snap = snapshots.make(deps, caller, command(VmSnapshotIn, handle=handle, vm_id=vm.id,
                                                name=f"fork of {sandbox}")).snapshot
    source = stored(deps, vm.id)
    now = deps.clock.now()
    like = replace(source, started_at=now, end_at=now + timedelta(seconds=timeout)) \
        if source is not None else Sandbox(vm.id, caller.user, vm.task_id, vm.image, now,
                                           now + timedelta(seconds=timeout))
    results: list[dict[str, Any]] = [{} for _ in range(count)]

    def one(n: int) -> None:
        try:
            fork_handle, made = start_fork(deps, caller, snap.id, TASK_PREFIX + like.template)
            results[n] = {"sandbox": _remember(deps, registry, fork_handle, made, like)}
        except Exception as exc:  # each fork answers its own failure
            deps.log.warning("an e2b fork did not start", extra={
                "sandbox": sandbox, "snapshot_id": snap.id, "error": str(exc)})
            results[n] = {"error": _error(exc)}

    try:
        threads = [threading.Thread(target=one, args=(n,), name="rift-e2b-fork", daemon=True)
                   for n in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        with suppress(RiftError):  # the lease moved on: the task's close removes it
            snapshots.delete(deps, caller, command(VmSnapshotDeleteIn, handle=handle,
                                                   snapshot_id=snap.id))
    return results
