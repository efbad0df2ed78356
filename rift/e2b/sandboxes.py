"""The control plane's calls (E2B's `/sandboxes` routes) as engine use cases: a
sandbox is a task of its own (named `e2b <template>`, held by `e2b:<token label>`)
and one VM in it; the `envdAccessToken` is that task's handle (the engine keeps
only its digest). Blocking: the routes run these in worker threads.

What the engine has no place for (a sandbox's template, metadata, envVars, its
end, its secured and public-traffic wishes, its traffic token's digest, what its
end does) is in the store (`tx.sandboxes`, rift.domain.sandboxes), so a restart
or another replica knows it; rift.e2b.deadlines ends a sandbox at its end. Only
the handle and the traffic token this process answered last stay in its memory
(`Registry`), never stored: connects by the same holder share them; after a
restart, or on another replica, a connect mints new ones (rift.e2b.lifecycle).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.views import VmView
from rift.contract.vms import AttachBody
from rift.domain.errors import (
    HypervisorFailed,
    InvalidArgument,
    TaskClosed,
    Unauthorized,
    VmNotFound,
)
from rift.domain.sandboxes import Sandbox
from rift.domain.secrets import digest
from rift.e2b import code_templates, shapes
from rift.e2b import volume_mounts as e2b_volumes
from rift.e2b.forking import names_snapshot, start_fork
from rift.e2b.network import egress_of
from rift.e2b.template_steps import untagged
from rift.services.access import accounts
from rift.services.context import Caller, Deps
from rift.services.lifecycle import tasks, vms

TASK_PREFIX = "e2b "
DEFAULT_TIMEOUT_S = 300
MAX_TIMEOUT_S = 24 * 3600
# A sleeping VM (SPEC §17) is a running sandbox to E2B: any call wakes it.
LIVE = {"running": "running", "paused": "paused", "creating": "running",
        "starting": "running", "sleeping": "running"}


class Registry:
    """What this process answered last, by sandbox id, in its memory only: the
    handle (envdAccessToken) and the traffic token (thread-safe). `get` reads the
    sandbox's stored settings (the data plane's envVars). Also the door's settings:
    `domain` (RIFT_PREVIEW_DOMAIN) and whether the operator allows ports reached
    without the traffic token (RIFT_E2B_PUBLIC_PORTS)."""

    def __init__(self, deps: Callable[[], Deps] | None = None, domain: str | None = None,
                 public_ports: bool = False) -> None:
        self.domain = domain
        self.public_ports = public_ports
        self._lock = threading.Lock()
        self._handles: dict[str, str] = {}
        self._traffic: dict[str, str] = {}
        self._deps = deps

    def hold(self, sandbox: str, handle: str, traffic: str | None = None) -> None:
        with self._lock:
            self._handles[sandbox] = handle
            if traffic is not None:
                self._traffic[sandbox] = traffic

    def keep_traffic(self, sandbox: str, token: str) -> None:
        with self._lock:
            self._traffic[sandbox] = token

    def held(self) -> list[tuple[str, str]]:
        """(sandbox, handle) of each handle this process answered (memory only)."""
        with self._lock:
            return list(self._handles.items())

    def handle_of(self, sandbox: str) -> str | None:
        with self._lock:
            return self._handles.get(sandbox)

    def traffic_of(self, sandbox: str) -> str | None:
        with self._lock:
            return self._traffic.get(sandbox)

    def forget(self, sandbox: str) -> None:
        with self._lock:
            self._handles.pop(sandbox, None)
            self._traffic.pop(sandbox, None)

    def get(self, sandbox: str) -> Sandbox | None:
        vm_id = shapes.vm_id(sandbox)
        if self._deps is None or vm_id is None:
            return None
        with self._deps().store.read() as tx:
            return tx.sandboxes.get(vm_id)


def caller_of(deps: Deps, api_key: str | None) -> Caller:
    """The user an `X-API-Key` (a Rift API token) names, as holder `e2b:<label>`."""
    if not api_key:
        raise Unauthorized()
    record, caller = accounts.authenticate(deps, api_key)
    return Caller(caller.user, f"e2b:{record.label}", operator=caller.operator)


def _strings(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, dict) or len(value) > 256 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 256 and len(v) <= 4096
            for k, v in value.items()):
        raise InvalidArgument(key, "an object of at most 256 strings")
    return dict(value)


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(key, "true or false")
    return value


def timeout_of(value: Any) -> int:
    if value is None:
        return DEFAULT_TIMEOUT_S
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_TIMEOUT_S:
        raise InvalidArgument("timeout", f"whole seconds, 1–{MAX_TIMEOUT_S}")
    return value


def public_traffic_of(body: dict[str, Any]) -> bool:
    """`network.allowPublicTraffic` (E2B's default: true)."""
    network = body.get("network") or {}
    if not isinstance(network, dict):
        raise InvalidArgument("network", "an object")
    return _flag(network, "allowPublicTraffic", True)


def lifecycle_of(body: dict[str, Any]) -> tuple[str, bool]:
    """What the sandbox's end does (`autoPause`: pause, else kill) and `autoResume`."""
    resume = body.get("autoResume") or {}
    if not isinstance(resume, dict):
        raise InvalidArgument("autoResume", "an object such as {\"enabled\": true}")
    return ("pause" if _flag(body, "autoPause", False) else "kill",
            _flag(resume, "enabled", False))


def new_traffic_token() -> str:
    return "rift_traffic_" + secrets.token_urlsafe(24)


def _template_of(body: dict[str, Any]) -> str:
    template = body.get("templateID")
    if not isinstance(template, str) or not 0 < len(template) <= 200:
        raise InvalidArgument("templateID", "the template (an image name; base is the default)")
    return untagged(template, "templateID")  # `name:default` is `name`; no other tag


def _start_vm(deps: Deps, caller: Caller, template: str, egress: object,
              mounts: list[AttachBody]) -> tuple[str, VmView]:
    """A task of its own and the sandbox's VM in it, with its volumes mounted: (the
    task's handle, the VM)."""
    opened = tasks.new(deps, caller, command(c.TaskNewIn, name=TASK_PREFIX + template))
    handle = opened.handle
    close = command(c.TaskCloseIn, handle=handle)
    image = None if template == "base" else code_templates.template_image(deps, template)
    try:
        vm = vms.new(deps, caller, command(c.VmNewIn, handle=handle, name="sandbox",
                                           image=image, egress=egress,
                                           volumes=mounts or None)).vm
    except BaseException:
        tasks.close(deps, caller, close)
        raise
    if vm.status not in ("running", "paused"):
        tasks.close(deps, caller, close)
        raise HypervisorFailed(f"the sandbox's VM did not start: {vm.error or vm.status}",
                               vm.host)
    return handle, vm


def create(deps: Deps, registry: Registry, caller: Caller, body: dict[str, Any],
           ) -> dict[str, Any]:
    """POST /v2/sandboxes (and /sandboxes): a task of its own and one VM of the template's
    image (`base` is RIFT_DEFAULT_IMAGE); answers E2B's `Sandbox`."""
    template = _template_of(body)
    timeout = timeout_of(body.get("timeout"))
    metadata, envs = _strings(body, "metadata"), _strings(body, "envVars")
    secure, public = _flag(body, "secure", False), public_traffic_of(body)
    on_timeout, auto_resume = lifecycle_of(body)
    shapes.command_line("true", [], envs, None)  # names checked before anything is made
    egress = egress_of(body)  # E2B's network rules as Rift's egress (rift.e2b.network)
    mounts = e2b_volumes.mounts_of(deps, caller, body)  # volumeMounts, by name
    if names_snapshot(template):
        handle, vm = start_fork(deps, caller, template, TASK_PREFIX + template, egress)
        vm = e2b_volumes.attach_to_fork(deps, caller, handle, vm, mounts)
    else:
        handle, vm = _start_vm(deps, caller, template, egress, mounts)
        if template in code_templates.TEMPLATES:
            code_templates.start_kernel(deps, vm.id)
    sandbox, traffic = shapes.sandbox_id(vm.id), new_traffic_token()
    now = deps.clock.now()
    record = Sandbox(vm.id, caller.user, vm.task_id, template, now,
                     now + timedelta(seconds=timeout), metadata, envs, secure, public,
                     digest(traffic), on_timeout, auto_resume)  # type: ignore[arg-type]
    with deps.store.write() as tx:
        tx.sandboxes.add(record)
    registry.hold(sandbox, handle, traffic)
    return answer(registry, sandbox, template, handle, traffic)


def answer(registry: Registry, sandbox: str, template: str, handle: str,
           traffic: str | None) -> dict[str, Any]:
    """E2B's `Sandbox`: what create and connect answer. `domain` is
    RIFT_PREVIEW_DOMAIN, where `get_host(port)` names reach the sandbox's ports."""
    return {"templateID": template, "sandboxID": sandbox, "alias": template,
            "clientID": shapes.CLIENT_ID, "envdVersion": shapes.ENVD_VERSION,
            "envdAccessToken": handle, "trafficAccessToken": traffic,
            "domain": registry.domain}


def live_vm(deps: Deps, caller: Caller, sandbox: str) -> VmView:
    """The caller's live VM a sandbox id names; anything else (unknown, another
    user's, gone) is the same `vm_not_found`."""
    vm_id = shapes.vm_id(sandbox)
    if vm_id is None:
        raise VmNotFound(sandbox)
    vm = vms.get(deps, caller, c.VmGetIn(vm_id=vm_id)).vm
    if vm.status not in LIVE:
        raise VmNotFound(vm_id)
    return vm


def stored(deps: Deps, vm_id: str) -> Sandbox | None:
    with deps.store.read() as tx:
        return tx.sandboxes.get(vm_id)


def ended(deps: Deps, vm_id: str) -> bool:
    """Whether the sandbox's end has passed (its kill may be under way: it is over)."""
    with deps.store.read() as tx:
        found = tx.sandboxes.get(vm_id)
    return found is not None and found.end_at is not None and \
        found.end_at <= deps.clock.now()


def kill(deps: Deps, registry: Registry, caller: Caller, sandbox: str) -> None:
    """DELETE /sandboxes/{id}: the sandbox's task is closed (its VM destroyed), taking
    it over if another holder has it; a VM in a task not of this door is destroyed
    alone."""
    vm = live_vm(deps, caller, sandbox)
    task = tasks.get(deps, caller, c.TaskGetIn(task_id=vm.task_id)).task
    if task.name.startswith(TASK_PREFIX) and not task.snapshots:  # else kept for them
        with contextlib.suppress(TaskClosed):  # closed meanwhile: nothing left to kill
            tasks.close(deps, caller, c.TaskCloseIn(task_id=task.id, takeover=True))
    else:
        vms.destroy(deps, caller, c.VmDestroyIn(vm_id=vm.id, takeover=True))
    forget(deps, registry, vm.id)


def forget(deps: Deps, registry: Registry, vm_id: str) -> None:
    with deps.store.write() as tx:
        tx.sandboxes.remove(vm_id)
    registry.forget(shapes.sandbox_id(vm_id))


def ends(deps: Deps, caller: Caller, vm: VmView, timeout: int, *, longer_only: bool) -> None:
    """The sandbox's end moves to now + timeout (`longer_only`: never earlier). A VM
    of the caller's the door did not make gets a record of its own here."""
    end = deps.clock.now() + timedelta(seconds=timeout)
    with deps.store.write() as tx:
        found = tx.sandboxes.get(vm.id)
        if found is None:
            tx.sandboxes.add(Sandbox(vm.id, caller.user, vm.task_id, vm.image,
                                     deps.clock.now(), end))
        elif not longer_only or found.end_at is None or end > found.end_at:
            tx.sandboxes.set_end(vm.id, end)


def set_timeout(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
                body: dict[str, Any]) -> None:
    """POST /sandboxes/{id}/timeout: the sandbox's end moves to now + timeout."""
    timeout = timeout_of(body.get("timeout"))
    ends(deps, caller, live_vm(deps, caller, sandbox), timeout, longer_only=False)
