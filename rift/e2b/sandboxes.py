"""The control plane's calls (E2B's `/sandboxes` routes) as engine use cases: a
sandbox is a task of its own (named `e2b <template>`, held by `e2b:<token label>`)
and one VM in it; the `envdAccessToken` is that task's handle (the engine keeps
only its digest). Blocking: the routes run these in worker threads.

What the engine has no place for yet (a sandbox's metadata, envVars and its
timeout's end) is kept here, in this process's memory (`Extras`): a restart
forgets it (README: Connect E2B code); rift.e2b.deadlines kills a sandbox at
its end.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.views import TaskView, VmView
from rift.domain.errors import (
    HypervisorFailed,
    InvalidArgument,
    TaskClosed,
    Unauthorized,
    VmNotFound,
)
from rift.e2b import shapes
from rift.services.access import accounts
from rift.services.context import Caller, Deps
from rift.services.lifecycle import tasks, vms

TASK_PREFIX = "e2b "
DEFAULT_TIMEOUT_S = 300
MAX_TIMEOUT_S = 24 * 3600
MAX_LIST = 100
LIVE = {"running": "running", "paused": "paused", "creating": "running",
        "starting": "running"}


@dataclass(frozen=True)
class Extras:
    template: str
    started_at: datetime
    end_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    # The task's handle this door answered last: kept in memory only (never stored),
    # so that connects by the same holder share the lease (rift.e2b.lifecycle).
    handle: str | None = field(default=None, repr=False)
    owner: str = ""  # the user whose sandbox it is: its deadline ends it (rift.e2b.deadlines)


class Registry:
    """Each sandbox's extras, by sandbox id, in this process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, Extras] = {}

    def put(self, sandbox: str, extras: Extras) -> None:
        with self._lock:
            self._by_id[sandbox] = extras

    def get(self, sandbox: str) -> Extras | None:
        with self._lock:
            return self._by_id.get(sandbox)

    def drop(self, sandbox: str) -> None:
        with self._lock:
            self._by_id.pop(sandbox, None)

    def hold(self, sandbox: str, handle: str, fallback: Extras) -> None:
        with self._lock:
            found = self._by_id.get(sandbox, fallback)
            self._by_id[sandbox] = replace(found, handle=handle)

    def due(self, now: datetime) -> list[tuple[str, str]]:
        """The sandboxes (and their owners) whose end has come."""
        with self._lock:
            return [(sid, found.owner) for sid, found in self._by_id.items()
                    if found.owner and found.end_at <= now]

    def ends(self, sandbox: str, end_at: datetime) -> None:
        with self._lock:
            found = self._by_id.get(sandbox)
            if found is not None:
                self._by_id[sandbox] = replace(found, end_at=end_at)


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


def timeout_of(value: Any) -> int:
    if value is None:
        return DEFAULT_TIMEOUT_S
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_TIMEOUT_S:
        raise InvalidArgument("timeout", f"whole seconds, 1–{MAX_TIMEOUT_S}")
    return value


def create(deps: Deps, registry: Registry, caller: Caller, body: dict[str, Any],
           ) -> dict[str, Any]:
    """POST /v2/sandboxes (and /sandboxes): a task of its own and one VM of the template's
    image (`base` is RIFT_DEFAULT_IMAGE); answers E2B's `Sandbox`."""
    template = body.get("templateID")
    if not isinstance(template, str) or not 0 < len(template) <= 200:
        raise InvalidArgument("templateID", "the template (an image name; base is the default)")
    timeout = timeout_of(body.get("timeout"))
    metadata = _strings(body, "metadata")
    envs = _strings(body, "envVars")
    shapes.command_line("true", [], envs, None)  # names checked before anything is made
    internet = body.get("allow_internet_access")
    egress = "none" if internet is False else None
    image = None if template == "base" else template
    opened = tasks.new(deps, caller, command(c.TaskNewIn, name=TASK_PREFIX + template))
    handle = opened.handle
    close = command(c.TaskCloseIn, handle=handle)
    try:
        vm = vms.new(deps, caller, command(c.VmNewIn, handle=handle, name="sandbox",
                                           image=image, egress=egress)).vm
    except BaseException:
        tasks.close(deps, caller, close)
        raise
    if vm.status not in ("running", "paused"):
        tasks.close(deps, caller, close)
        raise HypervisorFailed(f"the sandbox's VM did not start: {vm.error or vm.status}",
                               vm.host)
    sandbox = shapes.sandbox_id(vm.id)
    now = deps.clock.now()
    registry.put(sandbox, Extras(template, now, now + timedelta(seconds=timeout),
                                 metadata, envs, handle, caller.user))
    return answer(sandbox, template, handle)


def answer(sandbox: str, template: str, handle: str) -> dict[str, Any]:
    """E2B's `Sandbox`: what create and connect answer."""
    return {"templateID": template, "sandboxID": sandbox, "alias": template,
            "clientID": shapes.CLIENT_ID, "envdVersion": shapes.ENVD_VERSION,
            "envdAccessToken": handle, "trafficAccessToken": None, "domain": None}


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


def _listed(vm: VmView, extras: Extras | None) -> dict[str, Any]:
    started = extras.started_at if extras else None
    return {"templateID": extras.template if extras else vm.image,
            "alias": extras.template if extras else vm.image,
            "sandboxID": shapes.sandbox_id(vm.id), "clientID": shapes.CLIENT_ID,
            "startedAt": shapes.iso(started) or vm.ready_at or vm.created_at,
            "endAt": shapes.iso(extras.end_at) if extras else
            (vm.ready_at or vm.created_at),
            "cpuCount": vm.vcpus, "memoryMB": vm.memory_mib, "diskSizeMB": vm.disk_gib * 1024,
            "state": LIVE[vm.status], "envdVersion": shapes.ENVD_VERSION,
            "metadata": dict(extras.metadata) if extras else {}}


def info(deps: Deps, registry: Registry, caller: Caller, sandbox: str) -> dict[str, Any]:
    """GET /sandboxes/{id}: E2B's `SandboxDetail` (no access token: it is not stored)."""
    vm = live_vm(deps, caller, sandbox)
    return _listed(vm, registry.get(sandbox))


def _wanted(query: dict[str, str]) -> tuple[set[str], dict[str, str], int]:
    states = {s for s in query.get("state", "running,paused").split(",") if s}
    if not states <= {"running", "paused"}:
        raise InvalidArgument("state", "running, paused or both (comma-separated)")
    metadata = dict(urllib.parse.parse_qsl(query.get("metadata", ""), keep_blank_values=True))
    limit_text = query.get("limit", str(MAX_LIST))
    if not limit_text.isdigit() or not 0 < int(limit_text) <= MAX_LIST:
        raise InvalidArgument("limit", f"1–{MAX_LIST}")
    return states, metadata, int(limit_text)


def listing(deps: Deps, registry: Registry, caller: Caller, query: dict[str, str],
            ) -> tuple[list[dict[str, Any]], str | None]:
    """GET /v2/sandboxes: the caller's sandboxes (tasks opened by this door) in the
    states asked, whose metadata has every pair asked; paged by task (`nextToken`
    is the last task's id)."""
    states, metadata, limit = _wanted(query)
    after = query.get("nextToken") or None
    found: list[dict[str, Any]] = []
    while True:
        page = tasks.list_tasks(deps, caller, command(c.TaskListIn, status="open", limit=50,
                                                      after=after))
        for task in page.tasks:
            for listed in _sandboxes_of(task, registry):
                extras_meta = listed["metadata"]
                if listed["state"] in states and all(
                        extras_meta.get(k) == v for k, v in metadata.items()):
                    found.append(listed)
            after = task.id
            if len(found) >= limit:
                return found[:limit], after
        if page.next_after is None:
            return found, None
        after = page.next_after


def _sandboxes_of(task: TaskView, registry: Registry) -> list[dict[str, Any]]:
    if not task.name.startswith(TASK_PREFIX):
        return []
    return [_listed(vm, registry.get(shapes.sandbox_id(vm.id)))
            for vm in task.vms if vm.status in LIVE]


def kill(deps: Deps, registry: Registry, caller: Caller, sandbox: str) -> None:
    """DELETE /sandboxes/{id}: the sandbox's task is closed (its VM destroyed), taking
    it over if another holder has it; a VM in a task not of this door is destroyed
    alone."""
    vm = live_vm(deps, caller, sandbox)
    task = tasks.get(deps, caller, c.TaskGetIn(task_id=vm.task_id)).task
    if task.name.startswith(TASK_PREFIX):
        with contextlib.suppress(TaskClosed):  # closed meanwhile: nothing left to kill
            tasks.close(deps, caller, c.TaskCloseIn(task_id=task.id, takeover=True))
    else:
        vms.destroy(deps, caller, c.VmDestroyIn(vm_id=vm.id, takeover=True))
    registry.drop(sandbox)


def set_timeout(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
                body: dict[str, Any]) -> None:
    """POST /sandboxes/{id}/timeout: the sandbox's end moves to now + timeout."""
    timeout = timeout_of(body.get("timeout"))
    live_vm(deps, caller, sandbox)
    registry.ends(sandbox, deps.clock.now() + timedelta(seconds=timeout))


def metrics(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
            ) -> list[dict[str, Any]]:
    """GET /sandboxes/{id}/metrics: Rift keeps a VM's latest sample only (SPEC §14), so
    the answer is that one sample (none before the first)."""
    vm = live_vm(deps, caller, sandbox)
    stats = vm.stats
    if stats is None:
        return []
    moment = datetime.fromisoformat(stats.at.replace("Z", "+00:00"))
    mib = 1024 * 1024
    return [{"timestamp": stats.at, "timestampUnix": int(moment.timestamp()),
             "cpuCount": vm.vcpus, "cpuUsedPct": stats.cpu_pct or 0.0,
             "memUsed": (stats.memory_used_mib or 0) * mib, "memTotal": vm.memory_mib * mib,
             "memCache": 0, "diskUsed": stats.disk_used_bytes or 0,
             "diskTotal": vm.disk_gib * 1024 * mib}]
