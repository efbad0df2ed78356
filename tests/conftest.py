"""Shared fixtures: an engine on fakes and a real SQLite file (unit), and one on
SQLite + libvirt's test driver (integration)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from hypervisor.fake import FakeHypervisor
from rift.catalog import StaticImages
from rift.domain.clock import FakeClock
from rift.domain.leases import LeaseRules
from rift.services.context import Caller, Deps, Limits
from rift.services.hosts import ensure_local_host
from rift.store.sql import SqlStore

pytest_plugins = ["tests.conftest_store", "tests.e2e.replicas"]

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
        return self.by_uri[uri]

    def close(self) -> None:
        self.by_uri.clear()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pool() -> FakePool:
    return FakePool()


@pytest.fixture
def make_deps(clock: FakeClock, pool: FakePool,
              new_sqlite_url: Callable[[], str]) -> Iterator[Callable[..., Deps]]:
    """An engine on fake hypervisors and a real SQLite store: a fresh copy of the
    migrated template for each engine made."""
    with ExitStack() as stores:
        def make(**limits: int) -> Deps:
            store = SqlStore(new_sqlite_url())
            stores.callback(store.close)
            deps = Deps(store=store, clock=clock, hosts=pool, images=StaticImages(["debian"]),
                        lease_rules=LeaseRules(), limits=Limits(**limits))
            ensure_local_host(deps, "fake:///local")
            return deps
        yield make


@pytest.fixture
def deps(make_deps: Callable[..., Deps]) -> Deps:
    return make_deps()


@pytest.fixture
def local_hv(deps: Deps, pool: FakePool) -> FakeHypervisor:
    return pool.hypervisor("fake:///local")


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    path.mkdir()
    yield path
