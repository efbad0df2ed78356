"""Reconciliation (`rift serve`'s sweep) running while `rift host drain --move` (another
process) migrates a VM: what it does to the domain on each host and to the row."""

from __future__ import annotations

import threading
from dataclasses import replace

from hypervisor.base import DomainRecord, HypervisorError
from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.services.background import reconcile
from rift.services.context import Deps
from rift.services.lifecycle import tasks, vms
from rift.services.operator import hosts
from rift.services.operator.hosts import HostSize
from rift.services.operator.moves import drain_and_move
from tests.support.engine import ALICE, FakePool


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
