"""A move's mark (rift.services.operator.move_marks): a drain killed after the
switchover leaves a VM that runs on its destination, which reconciliation adopts
there once the mark is stale, never failing it or destroying its domain; a drain
that still works keeps its mark recent however long the migration runs. Fake
hypervisors, a real SQLite store; the kill is an exception no handler of the
drain catches."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import pytest

from hypervisor.base import DomainRecord, HypervisorError
from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import reconcile
from rift.services.context import Deps
from rift.services.lifecycle import tasks, vms, volumes
from rift.services.operator import hosts, move_copies, move_marks
from rift.services.operator.hosts import HostSize
from rift.services.operator.moves import drain_and_move
from tests.support.engine import ALICE, FakePool
from tests.support.volumes import far_vm_with_volume

FAR = "qemu+ssh://root@far.example/system"
FORWARD = ("<qemu:commandline xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>"
           "<qemu:arg value='user,id=net0,hostfwd=tcp:127.0.0.1:2345-:22'/>"
           "</qemu:commandline></domain>")


class Killed(BaseException):
    """SIGKILL, as far as the drain's handlers go: none of them runs."""


def _one_on_far(deps: Deps) -> tuple[str, str]:
    hosts.add_host(deps, "far", "fake:///far", HostSize(64, 1_000_000))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    assert vm.host == "far"
    return vm.id, opened.task.id


def _killed_after_the_switchover(deps: Deps, pool: FakePool) -> None:
    far = pool.hypervisor("fake:///far")
    real_migrate = far.migrate

    def migrate(dom: str, dest_uri: str, address: str, xml: str | None = None,
                copy_volumes: bool = False) -> None:
        assert xml is not None  # the drain's XML, forwarding the port it picked there
        real_migrate(dom, dest_uri, address, xml.replace("</domain>", FORWARD),
                     copy_volumes)
        raise Killed  # before the drain writes the row's new host

    far.migrate = migrate  # type: ignore[method-assign]
    with pytest.raises(Killed):
        drain_and_move(deps, "far")


def test_a_vm_a_drain_killed_after_the_switchover_left_is_adopted_where_it_runs(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    vm_id, task_id = _one_on_far(deps)
    _killed_after_the_switchover(deps, pool)
    assert f"rift-{vm_id}" in local_hv.domains
    assert not reconcile.reconcile(deps)  # the mark is recent: nothing is touched
    clock.advance(deps.limits.creating_grace_s + 1)
    first = reconcile.reconcile(deps)
    assert first.changes_settled == [vm_id]
    assert first.vanished == [] and first.orphans_destroyed == []
    second = reconcile.reconcile(deps)
    assert second.vanished == [] and second.orphans_destroyed == []
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "local")
    assert local_hv.domains[f"rift-{vm_id}"].active
    with deps.store.read() as tx:
        row = tx.vms.get(vm_id)
        events = [e for e in tx.events.page(task_id, 0, 1000) if e.type == "vm_moved"]
    assert row is not None and (row.change, row.ssh_port) == (None, 2345)
    assert [(e.details["from"], e.details["to"], e.details["ssh_port"]) for e in events] \
        == [("far", "local", 2345)]


def test_a_killed_moves_vm_running_on_two_hosts_is_left_and_nothing_destroyed(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    """Where its domain runs is unclear: the row stays marked for a later sweep, and
    neither domain is destroyed."""
    vm_id, _ = _one_on_far(deps)
    _killed_after_the_switchover(deps, pool)
    hosts.add_host(deps, "other", "fake:///other", HostSize(64, 1_000_000))
    name = f"rift-{vm_id}"
    other = pool.hypervisor("fake:///other")
    other.domains[name] = replace(local_hv.domains[name])
    clock.advance(deps.limits.creating_grace_s + 1)
    for _ in range(2):
        swept = reconcile.reconcile(deps)
        assert swept.vanished == [] and swept.orphans_destroyed == []
    assert name in local_hv.domains and name in other.domains
    with deps.store.read() as tx:
        row = tx.vms.get(vm_id)
    assert row is not None and (row.status, row.host, row.change) == ("running", "far",
                                                                       "moving")


def test_a_killed_moves_vm_whose_source_is_then_lost_is_adopted_not_failed(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    """The drained host stops answering after the drain died: past RIFT_HOST_LOST_S
    its VMs are failed, but not the one running on the destination."""
    vm_id, _ = _one_on_far(deps)
    _killed_after_the_switchover(deps, pool)
    def silent() -> list[DomainRecord]:
        raise HypervisorError("list", "no route to host")

    pool.hypervisor("fake:///far").list_domains = silent  # type: ignore[method-assign]
    assert reconcile.reconcile(deps).unreachable == ["far"]
    clock.advance(max(deps.limits.creating_grace_s, deps.limits.host_lost_s) + 1)
    for _ in range(2):
        swept = reconcile.reconcile(deps)
        assert swept.lost == [] and swept.orphans_destroyed == []
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "local")
    assert local_hv.domains[f"rift-{vm_id}"].active


def test_a_killed_moves_vm_whose_source_keeps_a_shut_off_definition_is_adopted(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    """The source lists the domain shut off (defined, not undefined after the
    switchover): the VM is adopted where it runs, and that definition goes."""
    vm_id, task_id = _one_on_far(deps)
    _killed_after_the_switchover(deps, pool)
    far = pool.hypervisor("fake:///far")
    far.add_foreign_domain(f"rift-{vm_id}", task_id, vm_id, False, deps.install_id)
    clock.advance(deps.limits.creating_grace_s + 1)
    swept = reconcile.reconcile(deps)
    assert swept.changes_settled == [vm_id] and swept.vanished == []
    assert f"rift-{vm_id}" not in far.domains and local_hv.domains[f"rift-{vm_id}"].active
    assert reconcile.reconcile(deps).orphans_destroyed == []
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "local")


def test_a_killed_moves_volumes_follow_the_adopted_vm_and_their_copies_stay(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor, clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """From a host elsewhere, its volume carried: once adopted, the volume's row names
    the destination (the copy the guest wrote to after the switchover), the copies
    stay, and the source's old file goes, as the drain would have done."""
    deps, files, _, vm_id, work = far_vm_with_volume(deps)
    pool.by_uri[FAR] = pool.hypervisor("fake:///far")  # far is a host elsewhere now
    with deps.store.write() as tx:
        was = tx.hosts.get("far", lock=True)
        assert was is not None and tx.hosts.save(was.resized(FAR, was.vcpus, was.memory_mib),
                                                 was)
    dead = f"{socket.gethostname()}/999999999/0"  # no such process on this machine
    monkeypatch.setattr(move_copies, "writer", lambda: dead)  # the drain's process
    _killed_after_the_switchover(deps, pool)
    monkeypatch.undo()
    files.calls.clear()
    clock.advance(deps.limits.creating_grace_s + 1)
    swept = reconcile.reconcile(deps)
    assert swept.changes_settled == [vm_id] and swept.vanished == []
    with deps.store.read() as tx:
        journal = tx.meta.get(move_copies.KEY)
    assert swept.copies_removed == [] and journal == "[]"
    assert files.calls == [("remove", work)]  # the source's file, on far
    assert volumes.get(deps, ALICE, command(c.VolumeIdIn, volume_id=work)).volume.host \
        == "local"
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "local")
    assert local_hv.domains[f"rift-{vm_id}"].active


def test_a_migration_longer_than_the_grace_keeps_its_mark_recent(
        deps: Deps, pool: FakePool, local_hv: FakeHypervisor, clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep after the switchover of a migration that took longer than
    RIFT_VM_CREATING_GRACE_S (the drain still working) neither fails nor settles the
    row: the drain set its mark anew meanwhile, and writes the move itself."""
    monkeypatch.setattr(move_marks, "REFRESH_S", 0.01)
    vm_id, _ = _one_on_far(deps)
    far = pool.hypervisor("fake:///far")
    real_migrate = far.migrate
    seen: list[reconcile.ReconcileReport] = []

    def migrate(*args: object, **kw: object) -> None:
        real_migrate(*args, **kw)  # type: ignore[arg-type]
        clock.advance(deps.limits.creating_grace_s + 1)
        for _ in range(1000):  # the drain's next refresh sets the mark's time to now
            with deps.store.read() as tx:
                row = tx.vms.get(vm_id)
            if row is not None and row.change_at == clock.now():
                break
            time.sleep(0.01)
        seen.append(reconcile.reconcile(deps))

    far.migrate = migrate  # type: ignore[method-assign]
    report = drain_and_move(deps, "far")
    assert seen[0].changes_settled == [] and seen[0].vanished == []
    assert seen[0].orphans_destroyed == []
    assert report.moved == [(vm_id, "local")]
    got = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert (got.status, got.host) == ("running", "local") and f"rift-{vm_id}" in local_hv.domains
