"""What the control plane reads (E2B's `GET` routes): a sandbox's detail, the
caller's sandboxes (filtered, ordered and paged as E2B answers) and its metrics.
Blocking: the routes run these in worker threads.

- **list** (`GET /v2/sandboxes`): the sandboxes this door made for the caller
  (its stored records, tx.sandboxes) whose VM lives and whose end has not come
  (the detail too: past its end a sandbox is over, its kill under way), filtered by `state`
  (`running`, `paused`), `metadata` (every pair asked), `template` and
  `startedAfter`; newest first (`order=asc`: oldest first); `limit` per page and
  the next page's `nextToken` (the `x-next-token` header) only when one is left.
- **metrics** (`GET /sandboxes/{id}/metrics`): Rift keeps a VM's latest usage
  sample only (SPEC §14), so the answer is that sample when it falls in
  `start`..`end` (Unix seconds, either open), else none.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rift.contract.views import VmView
from rift.domain.errors import InvalidArgument, VmNotFound
from rift.domain.model import Vm
from rift.domain.sandboxes import Sandbox
from rift.e2b import shapes
from rift.e2b.asleep import state_of
from rift.e2b.sandboxes import LIVE, Registry, live_vm, stored
from rift.e2b.volume_mounts import mounted
from rift.services.context import Caller, Deps

MAX_LIST = 100
_TOKEN = re.compile(r"([0-9]{1,20})-([a-z2-7]{8})")


@dataclass(frozen=True)
class Seen:
    """What the detail shows of a VM (a view's or a stored row's)."""

    status: str
    image: str
    vcpus: int
    memory_mib: int
    disk_gib: int
    since: str | None  # when it was ready (or made)

    @classmethod
    def of(cls, vm: Vm | VmView) -> Seen:
        return cls(vm.status, vm.image, vm.vcpus, vm.memory_mib, vm.disk_gib,
                   shapes.iso(vm.ready_at or vm.created_at))


def _detail(sandbox: str, seen: Seen, record: Sandbox | None,
            mounts: list[dict[str, str]]) -> dict[str, Any]:
    status, vcpus, memory_mib, disk_gib = seen.status, seen.vcpus, seen.memory_mib, \
        seen.disk_gib
    template = record.template if record else seen.image
    started = shapes.iso(record.started_at) if record else seen.since
    end = record.end_at if record and record.end_at else None
    detail: dict[str, Any] = {"templateID": template, "alias": template, "sandboxID": sandbox,
              "clientID": shapes.CLIENT_ID, "startedAt": started,
              "endAt": shapes.iso(end) or started,
              "cpuCount": vcpus, "memoryMB": memory_mib, "diskSizeMB": disk_gib * 1024,
              "state": state_of(status, record), "envdVersion": shapes.ENVD_VERSION,
              "metadata": dict(record.metadata) if record else {}, "volumeMounts": mounts}
    if record is not None:
        detail["lifecycle"] = {"onTimeout": record.on_timeout,
                               "autoResume": record.auto_resume}
    return detail


def info(deps: Deps, registry: Registry, caller: Caller, sandbox: str) -> dict[str, Any]:
    """GET /sandboxes/{id}: E2B's `SandboxDetail` (no access token: it is not stored)."""
    vm = live_vm(deps, caller, sandbox)
    record = stored(deps, vm.id)
    if record is not None and record.end_at is not None and \
            record.end_at <= deps.clock.now():
        raise VmNotFound(vm.id)  # over at its end (its kill may be under way)
    with deps.store.read() as tx:
        mounts = mounted(tx, [vm.id])[vm.id]
    return _detail(sandbox, Seen.of(vm), record, mounts)


@dataclass(frozen=True)
class Wanted:
    states: set[str]
    metadata: dict[str, str]
    template: str | None
    started_after: datetime | None
    newest_first: bool
    limit: int
    after: tuple[int, str] | None  # the last one listed: (started, in µs; sandbox id)


def _started_after(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        raise InvalidArgument("startedAfter", "an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise InvalidArgument("startedAfter", "an ISO 8601 time with its offset")
    return moment


def wanted(query: dict[str, str]) -> Wanted:
    states = {s for s in query.get("state", "running,paused").split(",") if s}
    if not states <= {"running", "paused"}:
        raise InvalidArgument("state", "running, paused or both (comma-separated)")
    metadata = dict(urllib.parse.parse_qsl(query.get("metadata", ""), keep_blank_values=True))
    limit_text = query.get("limit", str(MAX_LIST))
    if not limit_text.isdigit() or not 0 < int(limit_text) <= MAX_LIST:
        raise InvalidArgument("limit", f"1–{MAX_LIST}")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidArgument("order", "asc or desc")
    token = query.get("nextToken") or None
    match = _TOKEN.fullmatch(token) if token else None
    if token and match is None:
        raise InvalidArgument("nextToken", "the x-next-token of the page before")
    return Wanted(states, metadata, query.get("template") or None,
                  _started_after(query.get("startedAfter")), order == "desc",
                  int(limit_text), (int(match.group(1)), match.group(2)) if match else None)


def _key(record: Sandbox) -> tuple[int, str]:
    moment = record.started_at
    return (int(moment.timestamp()) * 1_000_000 + moment.microsecond,
            shapes.sandbox_id(record.vm_id))


def _fits(record: Sandbox, vm: Vm | None, want: Wanted, now: datetime) -> bool:
    return (vm is not None and vm.status in LIVE and state_of(vm.status, record) in want.states
            and (record.end_at is None or record.end_at > now)
            and all(record.metadata.get(k) == v for k, v in want.metadata.items())
            and (want.template is None or want.template == record.template)
            and (want.started_after is None or record.started_at >= want.started_after))


def listing(deps: Deps, registry: Registry, caller: Caller, query: dict[str, str],
            ) -> tuple[list[dict[str, Any]], str | None]:
    """GET /v2/sandboxes: one page and the next page's token (None when none is left)."""
    want, now = wanted(query), deps.clock.now()
    with deps.store.read() as tx:
        found = [(record, vm) for record in tx.sandboxes.of_owner(caller.user)
                 for vm in [tx.vms.get(record.vm_id)] if _fits(record, vm, want, now)]
        mounts = mounted(tx, [record.vm_id for record, _ in found])
    if want.newest_first:
        found.reverse()
    if want.after is not None:
        after = want.after
        found = [(r, vm) for r, vm in found
                 if (_key(r) < after if want.newest_first else _key(r) > after)]
    page, rest = found[:want.limit], found[want.limit:]
    listed = [_detail(shapes.sandbox_id(vm.id), Seen.of(vm), record, mounts[vm.id])
              for record, vm in page if vm is not None]
    if not rest:
        return listed, None
    last = _key(page[-1][0])
    return listed, f"{last[0]}-{last[1]}"


def _seconds(query: dict[str, str], key: str) -> int | None:
    text = query.get(key)
    if text is None or text == "":
        return None
    if not text.lstrip("-").isdigit() or len(text) > 20:
        raise InvalidArgument(key, "Unix seconds")
    return int(text)


def metrics(deps: Deps, registry: Registry, caller: Caller, sandbox: str,
            query: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """GET /sandboxes/{id}/metrics: the VM's latest sample, if it is in the range."""
    query = query or {}
    start, end = _seconds(query, "start"), _seconds(query, "end")
    vm: VmView = live_vm(deps, caller, sandbox)
    stats = vm.stats
    if stats is None:
        return []
    moment = int(datetime.fromisoformat(stats.at.replace("Z", "+00:00")).timestamp())
    if (start is not None and moment < start) or (end is not None and moment > end):
        return []
    mib = 1024 * 1024
    return [{"timestamp": stats.at, "timestampUnix": moment,
             "cpuCount": vm.vcpus, "cpuUsedPct": stats.cpu_pct or 0.0,
             "memUsed": (stats.memory_used_mib or 0) * mib, "memTotal": vm.memory_mib * mib,
             "memCache": 0, "diskUsed": stats.disk_used_bytes or 0,
             "diskTotal": vm.disk_gib * 1024 * mib}]
