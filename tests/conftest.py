"""Shared fixtures: an engine on fakes and a real SQLite file (unit), and one on
SQLite + libvirt's test driver (integration)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from hypervisor.fake import FakeHypervisor
from rift.catalog import StaticImages
from rift.domain.clock import FakeClock
from rift.domain.leases import LeaseRules
from rift.services.context import Deps, Limits
from rift.services.operator.hosts import ensure_local_host
from rift.store.sql import SqlStore
from tests.support.engine import FakePool

pytest_plugins = ["tests.conftest_store", "tests.e2e.replicas"]


# QEMU runs as its own unprivileged user (rift-qemu, scripts/libvirt.sh): on its way
# to a test's data dir (itself 0710, group rift-qemu: rift.bootstrap.qemu_dir) it
# passes through pytest's temporary folders, which pytest makes 0700. They are made
# passable (0711: no listing) as they are made.
_mktemp = pytest.TempPathFactory.mktemp


def _passable_mktemp(self: pytest.TempPathFactory, basename: str,
                     numbered: bool = True) -> Path:
    path = _mktemp(self, basename, numbered)
    base = self.getbasetemp()
    for folder in (path, *path.parents):
        if folder == base.parent.parent:
            break
        if folder.stat().st_uid == os.geteuid():
            folder.chmod(folder.stat().st_mode & 0o7777 | 0o111)
    return path


pytest.TempPathFactory.mktemp = _passable_mktemp  # type: ignore[method-assign]

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
