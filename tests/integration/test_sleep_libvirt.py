"""Sleep and wake (SPEC §17) on libvirt's test driver, wired by bootstrap as `rift
serve` does: a quiet task's VM is a managed save there (its domain stopped, its
state kept), and the next call that needs it starts the domain from it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hypervisor import write_test_host_xml
from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import sweeps
from rift.services.context import Deps
from rift.services.lifecycle import execs, snapshots, tasks, vms
from tests.support.engine import ALICE, refused

SLEEP_S = 5


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(data_dir: Path, tmp_path: Path, clock: FakeClock) -> Iterator[Deps]:
    uri = write_test_host_xml(str(tmp_path / "node.xml"), 8, 4096)
    deps = build_deps(Settings(data_dir=data_dir, hypervisor_uri=uri,
                               database_url=f"sqlite:///{tmp_path / 'rift.db'}",
                               task_sleep_s=SLEEP_S), clock=clock)
    yield deps
    close_deps(deps)


def test_a_quiet_vm_sleeps_as_a_managed_save_and_the_next_call_wakes_it(
        engine: Deps, clock: FakeClock) -> None:
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=3000)).vm
    with engine.store.read() as tx:
        host = tx.hosts.get(vm.host)
    assert host is not None
    conn = engine.hosts.hypervisor(host.uri)._connection()  # type: ignore[attr-defined]
    dom = conn.lookupByName(f"rift-{vm.id}")
    clock.advance(SLEEP_S + engine.lease_rules.activity_step_s + 1)
    assert sweeps.sweep(engine).slept == [vm.id]
    assert not dom.isActive() and dom.hasManagedSaveImage(0)
    # Its memory is free while it sleeps: a second VM of the same size fits.
    other = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=1000)).vm
    assert other.status == "running"
    # The test driver has no guest: the exec wakes the VM, then answers as it does there.
    err = refused("guest_unreachable", lambda: execs.start(engine, ALICE, command(
        c.VmExecIn, handle=handle, vm_id=vm.id, command="true")))
    assert "test driver" in err.message
    woke = vms.get(engine, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm
    assert woke.status == "running" and woke.woke is not None
    assert dom.isActive() and not dom.hasManagedSaveImage(0)
    clock.advance(SLEEP_S + engine.lease_rules.activity_step_s + 1)
    assert sorted(sweeps.sweep(engine).slept) == sorted([vm.id, other.id])
    snap = snapshots.make(engine, ALICE, command(c.VmSnapshotIn, handle=handle,
                          vm_id=vm.id)).snapshot  # wakes it, then saves it to a file
    assert snap.vm_id == vm.id and dom.isActive()
    events = [e.type for e in tasks.events(engine, ALICE, command(
        c.TaskEventsIn, task_id=opened.task.id, limit=100)).events]
    assert (events.count("vm_slept"), events.count("vm_woke")) == (3, 2)
    closed = tasks.close(engine, ALICE, command(c.TaskCloseIn, handle=handle))
    assert sorted(closed.destroyed) == sorted([vm.id, other.id])  # the sleeping one too
