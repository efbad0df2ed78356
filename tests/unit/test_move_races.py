"""Reconciliation (`rift serve`'s sweep) running while `rift host drain --move` (another
process) migrates a VM: what it does to the domain on each host and to the row."""

from __future__ import annotations

import threading
from dataclasses import replace

from hypervisor.base import DomainRecord, HypervisorError
from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import reconcile, sweeps
from rift.services.context import SWEEP, Deps
from rift.services.lifecycle import execs, snapshots, tasks, vms, volume_attach
from rift.services.lifecycle.teardown import Closing, close_in_tx
from rift.services.operator import hosts
from rift.services.operator.hosts import HostSize
from rift.services.operator.moves import drain_and_move
from tests.support.engine import ALICE, FakePool, refused
from tests.support.fake_guest import FakeExecs, fake_guests
from tests.support.vm_rows import give_ssh_address, leave_cut_change


def _one_on_far(deps: Deps) -> str:
    hosts.add_host(deps, "far", "fake:///far", HostSize(64, 1_000_000))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    assert vm.host == "far"
    return vm.id


def test_a_sweep_during_the_migration_leaves_the_incoming_domain_alone(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor) -> None:
    """While QEMU streams, libvirt lists the incoming domain on the destination
    (paused, reason migration) with the source's metadata; the row still names the
    source."""
    vm_id = _one_on_far(deps)
    far = pool.hypervisor("fake:///far")
    name = f"rift-{vm_id}"
    real_migrate = far.migrate
    seen: list[reconcile.ReconcileReport] = []

    def migrate(dom: str, dest_uri: str, *args: object, **kw: object) -> None:
        local_hv.domains[dom] = replace(far.domains[dom])  # the incoming one
        seen.append(reconcile.reconcile(deps))
        if dom not in local_hv.domains:  # its QEMU killed: the source's job fails
            raise HypervisorError("migrate", "domain destroyed during incoming migration")
        del local_hv.domains[dom]
        real_migrate(dom, dest_uri, *args, **kw)  # type: ignore[arg-type]

    far.migrate = migrate  # type: ignore[method-assign]
    report = drain_and_move(deps, "far")
    assert seen[0].orphans_destroyed == []
    assert report.moved == [(vm_id, "local")] and name in local_hv.domains


def test_a_sweep_that_read_the_row_before_the_move_wrote_it_keeps_the_vm(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor) -> None:
    """The sweep read the row (on the source) and listed the source after the
    switchover (no domain there); the drain wrote the row's new host before the
    sweep failed it: the row is not failed, the domain on the destination stays."""
    vm_id = _one_on_far(deps)
    far = pool.hypervisor("fake:///far")
    real_migrate, real_list = far.migrate, far.list_domains
    switched, listed, written = threading.Event(), threading.Event(), threading.Event()

    def migrate(*args: object, **kw: object) -> None:
        real_migrate(*args, **kw)  # type: ignore[arg-type]
        switched.set()
        assert listed.wait(10)  # the row is written once the sweep listed the source

    def list_domains() -> list[DomainRecord]:
        found = real_list()  # after the switchover: the domain is not here
        listed.set()
        assert written.wait(10)
        return found

    far.migrate = migrate  # type: ignore[method-assign]
    drain = threading.Thread(target=lambda: (drain_and_move(deps, "far"), written.set()))
    drain.start()
    assert switched.wait(10)
    far.list_domains = list_domains  # type: ignore[method-assign]
    swept = reconcile.reconcile(deps)
    drain.join(10)
    assert swept.vanished == [] and swept.orphans_destroyed == []
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "local") and f"rift-{vm_id}" in local_hv.domains


def test_a_sweep_between_the_switchover_and_the_rows_write_keeps_the_vm(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor) -> None:
    """The whole sweep runs after the domain went to the destination and before the
    drain writes the row's new host: the row is marked moving, so the sweep neither
    fails it (its domain is not on the host it names) nor destroys the domain there."""
    vm_id = _one_on_far(deps)
    far = pool.hypervisor("fake:///far")
    real_migrate = far.migrate
    seen: list[reconcile.ReconcileReport] = []
    marked: list[tuple[str, str | None]] = []

    def migrate(*args: object, **kw: object) -> None:
        real_migrate(*args, **kw)  # type: ignore[arg-type]
        during = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
        marked.append((during.host, during.status))
        seen.append(reconcile.reconcile(deps))

    far.migrate = migrate  # type: ignore[method-assign]
    report = drain_and_move(deps, "far")
    assert marked == [("far", "running")]
    assert seen[0].vanished == [] and seen[0].orphans_destroyed == []
    assert report.moved == [(vm_id, "local")]
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "local") and f"rift-{vm_id}" in local_hv.domains


def test_a_vm_being_moved_takes_execs_refuses_a_snapshot_and_no_sweep_destroys_it(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor) -> None:
    """While it moves its VM runs (an exec starts), a snapshot is refused, and a
    closed task's sweep destroys it only once the drain wrote where it went."""
    deps = replace(deps, guests=fake_guests(execs=FakeExecs()))
    hosts.add_host(deps, "far", "fake:///far", HostSize(64, 1_000_000))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm_id = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm.id
    with deps.store.write() as tx:
        give_ssh_address(tx, vm_id)
    far = pool.hypervisor("fake:///far")
    real_migrate = far.migrate
    during = sweeps.SweepReport()

    def migrate(*args: object, **kw: object) -> None:
        execs.start(deps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                                         command="true"))
        refused("vm_not_running", snapshots.make, deps, ALICE,
                command(c.VmSnapshotIn, handle=handle, vm_id=vm_id))
        with deps.store.write() as tx:  # a close whose process died before its destroys
            task = tx.tasks.get(opened.task.id)
            assert task is not None
            close_in_tx(tx, task, Closing(SWEEP, "closed", deps.clock.now()))
        sweeps.finish_closing(deps, during)
        real_migrate(*args, **kw)  # type: ignore[arg-type]

    far.migrate = migrate  # type: ignore[method-assign]
    assert drain_and_move(deps, "far").moved == [(vm_id, "local")]
    assert during.destroyed == [] and during.refused == []
    after = sweeps.SweepReport()
    sweeps.finish_closing(deps, after)
    assert after.destroyed == [vm_id] and f"rift-{vm_id}" not in local_hv.domains


def test_a_move_mark_a_dead_drain_left_is_kept_then_rolled_back_while_the_domain_is_there(
        deps: Deps, clock: FakeClock) -> None:
    """The drain died after it marked the row: the sweeps leave it while the mark is
    recent; older than RIFT_VM_CREATING_GRACE_S, with its domain still running on the
    row's host, the mark is rolled back and the VM runs on."""
    vm_id = _one_on_far(deps)
    with deps.store.write() as tx:
        leave_cut_change(tx, vm_id, "running", "moving", clock.now())
    assert not reconcile.reconcile(deps).changes_settled
    clock.advance(deps.limits.creating_grace_s + 1)
    assert reconcile.reconcile(deps).changes_settled == [vm_id]
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "far")
    with deps.store.read() as tx:
        row = tx.vms.get(vm_id)
    assert row is not None and row.change is None


def test_a_vm_being_moved_takes_no_attach_and_no_detach(deps: Deps, clock: FakeClock) -> None:
    """The move carries the volumes the VM held when it began."""
    from tests.support.volumes import Files, Mounts, attach, new_vm, new_volume

    deps = replace(deps, volume_files=Files(), mounts=Mounts())
    _, handle, vm_id = new_vm(deps)
    held, other = new_volume(deps, "held"), new_volume(deps, "other")
    attach(deps, handle, vm_id, held, "/held")
    with deps.store.write() as tx:
        leave_cut_change(tx, vm_id, "running", "moving", clock.now())
    refused("vm_not_running", attach, deps, handle, vm_id, other, "/other")
    refused("vm_not_running", volume_attach.detach, deps, ALICE, command(
        c.VmDetachVolumeIn, handle=handle, vm_id=vm_id, volume_id=held))
