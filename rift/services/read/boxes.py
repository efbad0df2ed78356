"""What the Boxes page reads: one person's open tasks (newest activity first)
with their VMs, their recently closed tasks, their volumes (SPEC §18) with where
each is attached, and the store's change mark.

Tasks and VMs come out as the task views of SPEC §3 (the same fields the REST
and MCP doors show), so the page can show nothing an agent could not read:
never a handle, a token or a key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from rift.contract.views import TaskView, VolumeView
from rift.domain import usage
from rift.services.context import Deps
from rift.services.read import views

OPEN_MAX = 1000  # a person has at most RIFT_MAX_OPEN_TASKS (32 by default)
CLOSED_MAX = 10


@dataclass(frozen=True)
class BoxesPage:
    user: str
    open: list[TaskView]
    closed: list[TaskView]
    more_open: bool  # more than OPEN_MAX open tasks: the page says so
    mark: str  # the change mark when this was read
    digest: str  # of what the page shows; equal digests render the same page
    # Running VMs' recent (when, CPU %, memory MiB) samples, for the page's charts.
    usage: dict[str, list[tuple[float, float | None, int | None]]] = field(
        default_factory=dict)
    # The person's volumes, oldest first, each with the VMs that hold it.
    volumes: list[VolumeView] = field(default_factory=list)

    @property
    def version(self) -> str:
        """What the live stream sends as its event id: mark and digest."""
        return f"{self.mark}~{self.digest}"


def change_mark(deps: Deps) -> str:
    """The store's change mark: moves on every event and every touch."""
    with deps.store.read() as tx:
        return tx.web.change_mark().token


def read_page(deps: Deps, user: str) -> BoxesPage:
    """One consistent read: the mark, then what the page shows."""
    with deps.store.read() as tx:
        mark = tx.web.change_mark().token
        found = tx.tasks.page(user, "open", OPEN_MAX + 1, None)
        opened = found[:OPEN_MAX]
        closed = tx.tasks.recently_closed(user, CLOSED_MAX)
        opened.sort(key=lambda t: (t.last_activity_at, t.created_at), reverse=True)
        open_views = views.tasks(deps, tx, opened)
        closed_views = views.tasks(deps, tx, closed, open_parts=False)
        vms = tx.vms.of_tasks([t.id for t in opened])
        volume_views = [views.volume_now(tx, v)
                        for v in tx.volumes.of_owner(user) if v.state == "ready"]
    drawn = {vm.id: usage.history(vm.stats) for t in opened for vm in vms.get(t.id, [])
             if vm.status == "running" and vm.stats}
    shown = [[v.model_dump() for v in open_views], [v.model_dump() for v in closed_views],
             [v.model_dump() for v in volume_views]]
    blob = json.dumps([*shown, len(found) > OPEN_MAX, drawn],
                      sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return BoxesPage(user, open_views, closed_views, len(found) > OPEN_MAX, mark, digest,
                     usage=drawn, volumes=volume_views)
