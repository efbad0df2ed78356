"""Read-only questions across tasks, for metrics and the Boxes page."""

from __future__ import annotations

from rift.services.context import Deps


def counts(deps: Deps) -> tuple[int, int]:
    """(open tasks, running VMs) over every user."""
    with deps.store.read() as tx:
        return tx.tasks.count_open(None), tx.fleet.count_by_status("running")
