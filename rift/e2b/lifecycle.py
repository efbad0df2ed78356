"""A sandbox's lease across clients, and its pause (SPEC §16): `connect` and `pause`
as engine use cases. Blocking: the routes run these in worker threads.

- **connect** (`POST /v2/sandboxes/{id}/connect`, and `/sandboxes/{id}/connect`)
  answers the sandbox's access token: by the holder itself (`e2b:` and the same
  token label) the handle it already holds, so the clients share the lease;
  by anyone else (another token's label, or after an MCP agent's takeover) a
  takeover (`rift_task_attach` with `takeover`: its event recorded, the previous
  holder's next call refused naming the new one). A paused sandbox is resumed,
  one asleep since its end (`autoPause`, rift.e2b.asleep) woken, and its end
  starts again (the timeout given, else E2B's default).
- **pause** (`POST /sandboxes/{id}/pause`): `rift_vm_pause` with the sandbox's
  handle (the holder's, or taken over as connect does); 409 when already paused.

The handle and the traffic token that are shared are those this process answered
last (rift.e2b.sandboxes.Registry; memory only, never stored): after a restart,
or on another replica, a connect is a takeover by the same holder (a new handle;
the old one stops) and mints a new traffic token (the old one stops too).
"""

from __future__ import annotations

from typing import Any

from rift.contract import tools as c
from rift.contract.views import VmView
from rift.domain.errors import RiftError, VmNotRunning
from rift.domain.secrets import digest
from rift.e2b.asleep import state_of
from rift.e2b.sandboxes import (
    DEFAULT_TIMEOUT_S,
    Registry,
    answer,
    ends,
    live_vm,
    new_traffic_token,
    stored,
    timeout_of,
)
from rift.services.context import Caller, Deps
from rift.services.lifecycle import leases, pauses, sleeps, tasks


def held_handle(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
                vm: VmView) -> str:
    """The sandbox's handle for `caller`: the one it holds still, else a new one taken
    over (the task's previous holder loses it)."""
    handle = registry.handle_of(sandbox)
    if handle is not None:
        try:
            task = tasks.get(deps, caller, c.TaskGetIn(handle=handle)).task
        except RiftError:
            task = None  # the lease moved on (or the task ended): take it over below
        if task is not None and task.holder == caller.label:
            return handle
    won = leases.attach(deps, caller, c.TaskAttachIn(task_id=vm.task_id, takeover=True))
    registry.hold(sandbox, won.handle)
    return won.handle


def traffic_token(deps: Deps, registry: Registry, sandbox: str, vm_id: str) -> str | None:
    """The traffic token this process answered last, else a new one (its digest
    stored: the one before stops)."""
    token = registry.traffic_of(sandbox)
    if token is not None:
        return token
    token = new_traffic_token()
    with deps.store.write() as tx:
        if not tx.sandboxes.set_traffic(vm_id, digest(token)):
            return None  # a VM the door did not make: no traffic token
    registry.keep_traffic(sandbox, token)
    return token


def connect(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
            body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The sandbox's `Sandbox` answer and whether it was resumed (201) or ran (200).
    A timeout given only lengthens the sandbox's time."""
    timeout = body.get("timeout")
    vm = live_vm(deps, caller, sandbox)
    handle = held_handle(deps, registry, caller, sandbox, vm)
    record = stored(deps, vm.id)
    resumed = state_of(vm.status, record) == "paused"
    if vm.status == "paused":
        pauses.resume(deps, caller, c.VmHeldIn(handle=handle, vm_id=vm.id))
    elif resumed:  # asleep since its end: it has no end until this one
        sleeps.wake(deps, vm.id, caller.label)
        timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
    if timeout is not None:
        ends(deps, caller, vm, timeout_of(timeout), longer_only=True)
    template = record.template if record is not None else vm.image
    return (answer(registry, sandbox, template, handle,
                   traffic_token(deps, registry, sandbox, vm.id)), resumed)


def pause(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
          _body: dict[str, Any]) -> None:
    vm = live_vm(deps, caller, sandbox)
    if state_of(vm.status, stored(deps, vm.id)) == "paused":  # 409, as E2B answers
        raise VmNotRunning(vm.id, vm.status)
    handle = held_handle(deps, registry, caller, sandbox, vm)
    pauses.pause(deps, caller, c.VmHeldIn(handle=handle, vm_id=vm.id))
