"""Small helpers for the engine's unit tests."""

from __future__ import annotations

from typing import Any

import pytest

from hypervisor.fake import FakeHypervisor
from rift.domain.errors import RiftError
from rift.services.context import Caller, Deps

ALICE = Caller("alice", "mcp:claude-code")
ALICE_2 = Caller("alice", "mcp:cursor")
BOB = Caller("bob", "mcp:claude-code")


class FakePool:
    """Host pool over fake hypervisors, one per URI."""

    def __init__(self) -> None:
        self.by_uri: dict[str, FakeHypervisor] = {}

    def hypervisor(self, uri: str) -> FakeHypervisor:
        if uri not in self.by_uri:
            self.by_uri[uri] = FakeHypervisor(uri)
            self.by_uri[uri].peers = self.hypervisor  # live migration between them
        return self.by_uri[uri]

    def close(self) -> None:
        self.by_uri.clear()


def snapshot(deps: Deps) -> Any:
    """Everything the store holds about tasks, VMs and events."""
    with deps.store.read() as tx:
        tasks = tx.tasks.page(None, "all", 1000, None)
        return (
            tasks,
            {t.id: tx.vms.of_task(t.id) for t in tasks},
            {t.id: tx.events.page(t.id, 0, 1000) for t in tasks},
        )


def refused(code: str, call: Any, *args: Any, **kwargs: Any) -> RiftError:
    """Call and expect a refusal with this code and a hint naming a tool."""
    with pytest.raises(RiftError) as info:
        call(*args, **kwargs)
    err = info.value
    assert err.code == code, f"expected {code}, got {err.code}: {err.message}"
    assert err.hint
    return err


def event_types(deps: Deps, task_id: str) -> list[str]:
    with deps.store.read() as tx:
        return [e.type for e in tx.events.page(task_id, 0, 1000)]
