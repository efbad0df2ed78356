"""A sandbox's lease across clients, and its sleep (SPEC §16): `connect` and `pause`
as engine use cases. Blocking: the routes run these in worker threads.

- **connect** (`POST /v2/sandboxes/{id}/connect`, and `/sandboxes/{id}/connect`)
  answers the sandbox's access token: by the holder itself (`e2b:` and the same
  token label) the handle it already holds, so the clients share the lease;
  by anyone else (another token's label, or after an MCP agent's takeover) a
  takeover (`rift_task_attach` with `takeover`: its event recorded, the previous
  holder's next call refused naming the new one). A paused sandbox is resumed.
- **pause** (`POST /sandboxes/{id}/pause`): `rift_vm_pause` with the sandbox's
  handle (the holder's, or taken over as connect does); 409 when already paused.

The handle that is shared is the one this process answered last (rift.e2b.
sandboxes.Extras; memory only): after a restart, or on another replica, a
connect is a takeover by the same holder (a new token; the old one stops).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rift.contract import tools as c
from rift.contract.views import VmView
from rift.domain.errors import RiftError, VmNotRunning
from rift.e2b.sandboxes import LIVE, Extras, Registry, answer, live_vm, timeout_of
from rift.services.context import Caller, Deps
from rift.services.lifecycle import leases, pauses, tasks


def held_handle(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
                vm: VmView) -> str:
    """The sandbox's handle for `caller`: the one it holds still, else a new one taken
    over (the task's previous holder loses it)."""
    extras = registry.get(sandbox)
    if extras is not None and extras.handle is not None:
        try:
            task = tasks.get(deps, caller, c.TaskGetIn(handle=extras.handle)).task
        except RiftError:
            task = None  # the lease moved on (or the task ended): take it over below
        if task is not None and task.holder == caller.label:
            return extras.handle
    won = leases.attach(deps, caller, c.TaskAttachIn(task_id=vm.task_id, takeover=True))
    handle = won.handle
    now = deps.clock.now()
    registry.hold(sandbox, handle, Extras(vm.image, now, now + timedelta(seconds=300),
                                         owner=caller.user))
    return handle


def connect(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
            body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The sandbox's `Sandbox` answer and whether it was resumed (201) or ran (200).
    A timeout given only lengthens the sandbox's time."""
    timeout = body.get("timeout")
    vm = live_vm(deps, caller, sandbox)
    handle = held_handle(deps, registry, caller, sandbox, vm)
    resumed = LIVE[vm.status] == "paused"
    if resumed:
        pauses.resume(deps, caller, c.VmHeldIn(handle=handle, vm_id=vm.id))
    if timeout is not None:
        end = deps.clock.now() + timedelta(seconds=timeout_of(timeout))
        extras = registry.get(sandbox)
        if extras is not None and end > extras.end_at:
            registry.ends(sandbox, end)
    extras = registry.get(sandbox)
    template = extras.template if extras is not None else vm.image
    return answer(sandbox, template, handle), resumed


def pause(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
          _body: dict[str, Any]) -> None:
    vm = live_vm(deps, caller, sandbox)
    if LIVE[vm.status] == "paused":  # 409, as E2B answers (the SDK's `False`)
        raise VmNotRunning(vm.id, vm.status)
    handle = held_handle(deps, registry, caller, sandbox, vm)
    pauses.pause(deps, caller, c.VmHeldIn(handle=handle, vm_id=vm.id))

