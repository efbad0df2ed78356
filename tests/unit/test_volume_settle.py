"""Attaches and detaches a crash cut (rift.services.lifecycle.volume_settle), against
fakes: the row as the dead process left it, the disk plugged or not in the fake
hypervisor's domain, and a sweep's reconciliation settling them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hypervisor.base import VolumeDisk
from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.domain.volumes import Attachment
from rift.services.background import reconcile
from rift.services.context import Deps
from rift.services.lifecycle import pauses, volumes
from tests.support.engine import ALICE, event_types, refused
from tests.support.volumes import Files, Mounts
from tests.support.volumes import attach as _attach
from tests.support.volumes import new_vm as _vm
from tests.support.volumes import new_volume as _volume


@pytest.fixture
def vdeps(deps: Deps) -> Deps:
    return replace(deps, volume_files=Files(), mounts=Mounts())


def _row(deps: Deps, vm_id: str, volume_id: str) -> Attachment | None:
    with deps.store.read() as tx:
        found = [a for a in tx.volumes.of_vms([vm_id])[vm_id] if a.volume_id == volume_id]
    return found[0] if found else None


def _cut_attach(deps: Deps, hv: FakeHypervisor, task_id: str, vm_id: str, volume_id: str,
                plugged: bool, path: str = "/data", target: str = "vdc") -> None:
    """What an attach leaves when rift serve dies after its row (and, if `plugged`,
    after libvirt plugged the disk and the guest mounted it)."""
    att = Attachment(volume_id, vm_id, task_id, path, False, target, "attaching",
                     deps.clock.now())
    with deps.store.write() as tx:
        tx.volumes.attach(att)
    if plugged:
        hv.attach_disk(f"rift-{vm_id}", VolumeDisk(f"/volumes/{volume_id}.qcow2", target,
                                                    volume_id))
        deps.mounts.mounted[(vm_id, path)] = (volume_id, False)  # type: ignore[attr-defined]


def _attached_to(deps: Deps, volume_id: str) -> list[str]:
    got = volumes.get(deps, ALICE, command(c.VolumeIdIn, volume_id=volume_id)).volume
    return [a.vm_id for a in got.attached_to]


def test_a_cut_attach_is_undone_after_the_grace_whether_plugged_or_not(
        vdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _vm(vdeps)
    plugged_vol, unplugged_vol = _volume(vdeps, "a"), _volume(vdeps, "b")
    vdeps = replace(vdeps, mounts=_Mounts())
    _cut_attach(vdeps, local_hv, task_id, vm_id, plugged_vol, plugged=True)
    assert not reconcile.reconcile(vdeps).attachments_settled  # within the grace: under way
    assert _row(vdeps, vm_id, plugged_vol) is not None
    _cut_attach(vdeps, local_hv, task_id, vm_id, unplugged_vol, False, "/b", "vdd")
    clock.advance(vdeps.limits.creating_grace_s + 1)
    report = reconcile.reconcile(vdeps)
    assert sorted(report.attachments_settled) == sorted(
        [f"{vm_id}/{plugged_vol}", f"{vm_id}/{unplugged_vol}"])
    assert local_hv.domains[f"rift-{vm_id}"].disks == {}  # unplugged
    assert vdeps.mounts.unmounted == ["/data", "/b"]  # type: ignore[attr-defined]
    assert vdeps.mounts.mounted == {}  # type: ignore[attr-defined]
    assert _row(vdeps, vm_id, plugged_vol) is None and _attached_to(vdeps, plugged_vol) == []
    assert event_types(vdeps, task_id)[-2:] == ["volume_detached", "volume_detached"]
    assert not reconcile.reconcile(vdeps).attachments_settled  # nothing left
    # The volume a cut attach held for writing takes a writer again.
    vm = _attach(vdeps, handle, vm_id, plugged_vol).vm
    assert [m.volume_id for m in vm.volumes] == [plugged_vol]


class _Mounts(Mounts):
    def __init__(self) -> None:
        super().__init__()
        self.unmounted: list[str] = []

    def unmount(self, vm: object, path: str) -> None:  # type: ignore[override]
        self.unmounted.append(path)
        super().unmount(vm, path)  # type: ignore[arg-type]


def test_a_cut_detach_is_finished_at_the_next_sweep(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    _attach(vdeps, handle, vm_id, vol)
    att = _row(vdeps, vm_id, vol)
    assert att is not None and local_hv.domains[f"rift-{vm_id}"].disks
    with vdeps.store.write() as tx:  # the detach's first step, then rift serve died
        tx.volumes.save_attachment(att.detaching(), att)
    report = reconcile.reconcile(vdeps)
    assert report.attachments_settled == [f"{vm_id}/{vol}"]
    assert local_hv.domains[f"rift-{vm_id}"].disks == {}
    assert vdeps.mounts.mounted == {}  # type: ignore[attr-defined]
    assert _attached_to(vdeps, vol) == []
    assert event_types(vdeps, task_id)[-1] == "volume_detached"
    volumes.delete(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol))


def test_a_refused_unplug_keeps_the_row_for_the_next_sweep(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    _attach(vdeps, handle, vm_id, vol)
    att = _row(vdeps, vm_id, vol)
    assert att is not None
    with vdeps.store.write() as tx:
        tx.volumes.save_attachment(att.detaching(), att)
    local_hv.fail_next("detach", "internal error: unable to execute QEMU command")
    assert not reconcile.reconcile(vdeps).attachments_settled
    held = _row(vdeps, vm_id, vol)
    assert held is not None and held.state == "detaching"
    assert vol in local_hv.domains[f"rift-{vm_id}"].disks  # no disk without its row
    assert reconcile.reconcile(vdeps).attachments_settled == [f"{vm_id}/{vol}"]
    assert local_hv.domains[f"rift-{vm_id}"].disks == {}


def test_a_paused_vm_keeps_its_cut_attachment_until_it_runs(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    _attach(vdeps, handle, vm_id, vol)
    att = _row(vdeps, vm_id, vol)
    assert att is not None
    with vdeps.store.write() as tx:
        tx.volumes.save_attachment(att.detaching(), att)
    pauses.pause(vdeps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    assert not reconcile.reconcile(vdeps).attachments_settled
    pauses.resume(vdeps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    assert reconcile.reconcile(vdeps).attachments_settled == [f"{vm_id}/{vol}"]


def test_an_attach_that_outlives_the_grace_finds_its_row_gone_and_unplugs(
        vdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)

    class Slow(Mounts):
        def mount(self, vm: object, serial: str, path: str, read_only: bool) -> None:  # type: ignore[override]
            clock.advance(vdeps.limits.creating_grace_s + 1)
            assert reconcile.reconcile(slow).attachments_settled == [f"{vm_id}/{vol}"]
            super().mount(vm, serial, path, read_only)  # type: ignore[arg-type]

    slow = replace(vdeps, mounts=Slow())
    refused("hypervisor_error", _attach, slow, handle, vm_id, vol)
    assert local_hv.domains[f"rift-{vm_id}"].disks == {}
    assert slow.mounts.mounted == {}  # type: ignore[attr-defined]
    assert _row(vdeps, vm_id, vol) is None

