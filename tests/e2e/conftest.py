"""The e2e suite's fixtures: one real `rift serve` per module on libvirt's test
driver (`server`), and for the real-guest modules (test_real_*.py) one on
qemu:///system set up as the module's `REAL` says (`rig`, `real`), with a factory
that lends warm VMs (`guests`, `tiny`). Their helpers are tests/support/servers.py,
tests/support/real_guests.py and tests/support/witnesses.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.real_guests import Guest, Guests, RealSettings, Rig, module_tmp_name
from tests.support.servers import Server, start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(tmp_path_factory.mktemp("rift"))
    try:
        yield srv
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def rig(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """The module's `rift serve` on qemu:///system, set up as its `REAL` says."""
    settings = getattr(request.module, "REAL", None)
    assert isinstance(settings, RealSettings), \
        f"{request.module.__name__} names no REAL = RealSettings(...)"
    tmp = tmp_path_factory.mktemp(module_tmp_name(request.module.__name__))
    with Rig.started(tmp, settings) as started:
        yield started


@pytest.fixture
def real(rig: Rig) -> Server:
    """The module's server as it answers now (after any restart)."""
    return rig.server


@pytest.fixture(scope="module")
def guests(rig: Rig) -> Iterator[Guests]:
    factory = Guests(rig)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def tiny(guests: Guests) -> Iterator[Guest]:
    """A running `tiny` VM in a task of its own: warm when an earlier test of the
    module gave it back running."""
    with guests.lend("tiny") as guest:
        yield guest
