"""Volumes through forks, pauses and sleeps (SPEC §18): a fork's VMs get the source's
read-only volumes and not its writable ones, whose disks the fork's saved-state
XML takes on a stand-in; a paused or sleeping VM keeps its volumes. Against the
fake hypervisor (which keeps each saved state's disks) and pure XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from hypervisor.base import VolumeDisk
from hypervisor.fake import FakeHypervisor
from hypervisor.fork_xml import migrated_disks, volume_disks, with_volume_sources
from hypervisor.volumes import disk_xml, without_volume_chains
from rift.contract import tools as c
from rift.contract.base import command
from rift.services.context import Deps
from rift.services.lifecycle import pauses, sleeps, snapshots, vms, volume_attach, volumes
from rift.services.lifecycle.forks import fork
from tests.support.engine import ALICE, BOB, event_types, refused
from tests.support.saved_xml import SAVED_XML
from tests.support.saved_xml import fork as fork_xml
from tests.support.volumes import Files, Mounts
from tests.support.volumes import attach as _attach
from tests.support.volumes import new_vm as _vm
from tests.support.volumes import new_volume as _volume

WRITTEN = VolumeDisk("/var/lib/rift/volumes/vol_aaaaaaaa.qcow2", "vdc", "vol_aaaaaaaa")
READ = VolumeDisk("/var/lib/rift/volumes/vol_bbbbbbbb.qcow2", "vdd", "vol_bbbbbbbb", True)


@pytest.fixture
def vdeps(deps: Deps) -> Deps:
    return replace(deps, volume_files=Files(), mounts=Mounts())


def _with_volumes(xml: str) -> str:
    """A saved XML as libvirt writes it for a domain with two hot-plugged volumes."""
    plugged = "".join(disk_xml(d).replace("</disk>", "<address type='pci' domain='0x0000' "
                                          f"bus='0x0{n}' slot='0x00' function='0x0'/></disk>")
                      for n, d in ((5, WRITTEN), (6, READ)))
    return xml.replace("    <controller type='usb'", plugged + "\n    <controller type='usb'")


def test_a_saved_xml_with_volumes_forks_with_each_volume_disk_as_it_was() -> None:
    out = fork_xml(_with_volumes(SAVED_XML))
    assert volume_disks(SAVED_XML) == []
    assert volume_disks(out) == [WRITTEN, READ]  # the fork's vda rewrite leaves them
    stand_in = "/var/lib/rift/snapshots/snap_x/.stand-in-rift-vm_fork0001-vdc.qcow2"
    swapped = with_volume_sources(out, {WRITTEN.serial: stand_in})
    assert volume_disks(swapped) == [replace(WRITTEN, path=stand_in), READ]
    assert [line for line in swapped.splitlines() if line not in out.splitlines()] != []
    assert len(swapped.splitlines()) == len(out.splitlines())
    root = ET.fromstring(swapped)  # noqa: S314 - our own test XML
    sources = [d.find("source").get("file") for d in root.iterfind("devices/disk")]  # type: ignore[union-attr]
    assert sources == ["/var/lib/rift/disks/vm_fork0001.qcow2", stand_in, READ.path]
    with pytest.raises(ValueError, match="no disk"):
        with_volume_sources(out, {"vol_cccccccc": stand_in})
    with pytest.raises(ValueError, match="absolute"):
        with_volume_sources(out, {WRITTEN.serial: "relative.qcow2"})


def test_a_migration_carries_the_vms_own_disk_and_with_copy_volumes_its_writable_ones(
) -> None:
    held = _with_volumes(SAVED_XML)
    assert migrated_disks(SAVED_XML, True) == ["vda"]
    assert migrated_disks(held, False) == ["vda"]  # hosts of one machine share the file
    assert migrated_disks(held, True) == ["vda", WRITTEN.target]  # READ goes whole before
    no_disk = held.replace("dev='vda'", "dev='vdz'")  # tiny: no disk of its own
    assert migrated_disks(no_disk, False) == [] and migrated_disks(no_disk, True) == ["vdc"]


def test_a_fork_gets_the_read_only_volumes_and_not_the_writable_ones(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _vm(vdeps)
    written, shared = _volume(vdeps, "written"), _volume(vdeps, "shared")
    _attach(vdeps, handle, vm_id, written, "/work")
    _attach(vdeps, handle, vm_id, shared, "/data", read_only=True)
    made = fork(vdeps, ALICE, command(c.VmForkIn, handle=handle, vm_id=vm_id, count=2)).vms
    assert [v.status for v in made] == ["running", "running"]
    for forked in made:
        view = vms.get(vdeps, ALICE, command(c.VmGetIn, vm_id=forked.id)).vm
        assert [(m.volume_id, m.path, m.read_only) for m in view.volumes] == [
            (shared, "/data", True)]
        assert forked.volumes == view.volumes  # the fork's answer lists them too
        assert list(local_hv.domains[f"rift-{forked.id}"].disks) == [shared]
    source = vms.get(vdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert [(m.volume_id, m.read_only) for m in source.volumes] == [
        (written, False), (shared, True)]
    assert set(local_hv.domains[f"rift-{vm_id}"].disks) == {written, shared}
    got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=written)).volume
    assert [a.vm_id for a in got.attached_to] == [vm_id]  # still one writer
    readers = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=shared)).volume
    assert sorted(a.vm_id for a in readers.attached_to) == sorted([vm_id, *(v.id for v in made)])
    assert event_types(vdeps, task_id).count("volume_attached") == 2 + 2


def test_a_snapshots_view_lists_the_volumes_it_keeps_and_which_a_fork_attaches(
        vdeps: Deps) -> None:
    """The snapshot's answer, the task's view and a delete's answer list each volume
    its VM held (path, read-only or not, size then); a fork attaches the read-only
    ones, at that path, and those only. A snapshot of a VM holding none lists none."""
    from rift.services.lifecycle import tasks

    task_id, handle, vm_id = _vm(vdeps)
    written, shared = _volume(vdeps, "written", 4), _volume(vdeps, "shared", 2)
    bare = snapshots.make(vdeps, ALICE, command(c.VmSnapshotIn, handle=handle,
                                                vm_id=vm_id)).snapshot
    _attach(vdeps, handle, vm_id, written, "/work")
    _attach(vdeps, handle, vm_id, shared, "/data", read_only=True)
    snap = snapshots.make(vdeps, ALICE, command(c.VmSnapshotIn, handle=handle,
                                                vm_id=vm_id)).snapshot
    kept = [(k.volume_id, k.path, k.read_only, k.size_gib, k.forks_attach)
            for k in snap.volumes]
    assert kept == [(written, "/work", False, 4, False), (shared, "/data", True, 2, True)]
    assert bare.volumes == []
    shown = tasks.get(vdeps, ALICE, command(c.TaskGetIn, task_id=task_id)).task.snapshots
    assert {s.id: s.volumes for s in shown} == {bare.id: [], snap.id: snap.volumes}
    made = fork(vdeps, ALICE, command(c.VmForkIn, handle=handle, snapshot_id=snap.id)).vms
    assert [(m.volume_id, m.path, m.read_only) for m in made[0].volumes] == [
        (k.volume_id, k.path, True) for k in snap.volumes if k.forks_attach]
    gone = snapshots.delete(vdeps, ALICE, command(c.VmSnapshotDeleteIn, handle=handle,
                                                  snapshot_id=snap.id)).snapshot
    assert gone.volumes == snap.volumes
    shown = tasks.get(vdeps, ALICE, command(c.TaskGetIn, task_id=task_id)).task.snapshots
    assert [s.id for s in shown] == [bare.id]


def test_a_fork_from_a_snapshot_drops_a_read_only_volume_its_source_no_longer_holds(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    shared = _volume(vdeps, "shared")
    _attach(vdeps, handle, vm_id, shared, "/data", read_only=True)
    snap = snapshots.make(vdeps, ALICE, command(c.VmSnapshotIn, handle=handle,
                                                vm_id=vm_id)).snapshot.id
    volume_attach.detach(vdeps, ALICE, command(c.VmDetachVolumeIn, handle=handle, vm_id=vm_id,
                                               volume_id=shared))
    made = fork(vdeps, ALICE, command(c.VmForkIn, handle=handle, snapshot_id=snap)).vms
    assert made[0].status == "running" and made[0].volumes == []
    assert local_hv.domains[f"rift-{made[0].id}"].disks == {}  # no disk no row knows


def test_a_refused_unplug_fails_the_fork_and_takes_its_domain_down(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    _attach(vdeps, handle, vm_id, _volume(vdeps), "/work")
    local_hv.fail_next("detach", "internal error: unable to execute QEMU command")
    made = fork(vdeps, ALICE, command(c.VmForkIn, handle=handle, vm_id=vm_id)).vms
    assert made[0].status == "failed" and "unplugged" in (made[0].error or "")
    assert f"rift-{made[0].id}" not in local_hv.domains


def test_pause_and_sleep_keep_the_volumes_attached(vdeps: Deps,
                                                   local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    _attach(vdeps, handle, vm_id, vol, "/work")
    held = command(c.VmHeldIn, handle=handle, vm_id=vm_id)
    paused = pauses.pause(vdeps, ALICE, held).vm
    assert paused.status == "paused" and [m.volume_id for m in paused.volumes] == [vol]
    assert vol in local_hv.domains[f"rift-{vm_id}"].disks  # in the saved domain
    assert [m.volume_id for m in pauses.resume(vdeps, ALICE, held).vm.volumes] == [vol]
    assert sleeps.sleep_vm(vdeps, vm_id, "test", "quiet")
    asleep = vms.get(vdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert asleep.status == "sleeping" and [m.volume_id for m in asleep.volumes] == [vol]
    sleeps.wake(vdeps, vm_id, "test")
    awake = vms.get(vdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert awake.status == "running" and [m.volume_id for m in awake.volumes] == [vol]
    assert vol in local_hv.domains[f"rift-{vm_id}"].disks


def test_a_domain_started_from_a_saved_state_gets_none_of_its_volumes(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    """An image of a snapshot (DomainSpec.restore_from): its VMs hold no volume."""
    _, handle, vm_id = _vm(vdeps)
    _attach(vdeps, handle, vm_id, _volume(vdeps, "w"), "/work")
    _attach(vdeps, handle, vm_id, _volume(vdeps, "r"), "/data", read_only=True)
    source = local_hv.domains[f"rift-{vm_id}"]
    local_hv.save_state(source.name, "/snapshots/snap_x/state")
    assert source.spec is not None
    local_hv.create(replace(source.spec, name="rift-vm_imaged01", vm_id="vm_imaged01",
                            restore_from="/snapshots/snap_x/state"))
    assert local_hv.domains["rift-vm_imaged01"].active
    assert local_hv.domains["rift-vm_imaged01"].disks == {}
    assert len(local_hv.state_disks["/snapshots/snap_x/state"]) == 2  # the state keeps them


def test_a_snapshot_keeps_its_vms_volumes_and_a_clone_of_one_outlives_both(
        vdeps: Deps) -> None:
    """rift_volume_clone with snapshot_id: the volume as the snapshot keeps it (its
    size then), even after the volume is deleted; another user's snapshot is not
    found, one that keeps no such volume is invalid; the snapshot's delete drops
    what it kept, never the clone."""
    files: Files = vdeps.volume_files  # type: ignore[assignment]
    _, handle, vm_id = _vm(vdeps)
    vol, other = _volume(vdeps, "work", 4), _volume(vdeps, "spare", 2)
    _attach(vdeps, handle, vm_id, vol, "/work")
    snap = snapshots.make(vdeps, ALICE, command(c.VmSnapshotIn, handle=handle,
                                                vm_id=vm_id)).snapshot.id
    assert ("freeze", vol, snap) in files.calls and files.frozen("", snap) == {vol: 4}
    assert vdeps.mounts.flushed == [(vm_id, "/work")]  # type: ignore[attr-defined]
    with vdeps.store.read() as tx:
        task_id = tx.vms.get(vm_id).task_id  # type: ignore[union-attr]
        made = [e.details for e in tx.events.page(task_id, 0, 1000)
                if e.type == "snapshot_made"]
    assert made[0]["volumes"] == [  # the event lists what it keeps, as the VM held it
        {"volume_id": vol, "path": "/work", "read_only": False, "size_gib": 4}]
    volume_attach.detach(vdeps, ALICE, command(c.VmDetachVolumeIn, handle=handle,
                                               vm_id=vm_id, volume_id=vol))
    volumes.resize(vdeps, ALICE, command(c.VolumeResizeIn, volume_id=vol, size_gib=6))
    volumes.delete(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol))
    made = volumes.clone(vdeps, ALICE, command(c.VolumeCloneIn, volume_id=vol, name="back",
                                               snapshot_id=snap)).volume
    assert (made.parent_id, made.size_gib, made.name) == (vol, 4, "back")
    assert ("clone_frozen", snap, vol, made.id) in files.calls
    refused("snapshot_not_found", volumes.clone, vdeps, BOB,
            command(c.VolumeCloneIn, volume_id=vol, name="mine", snapshot_id=snap))
    refused("snapshot_not_found", volumes.clone, vdeps, ALICE,
            command(c.VolumeCloneIn, volume_id=vol, name="x", snapshot_id="snap_zzzzzzzz"))
    refused("invalid_argument", volumes.clone, vdeps, ALICE,
            command(c.VolumeCloneIn, volume_id=other, name="y", snapshot_id=snap))
    snapshots.delete(vdeps, ALICE, command(c.VmSnapshotDeleteIn, handle=handle,
                                           snapshot_id=snap))
    assert ("thaw", snap) in files.calls and files.frozen("", snap) == {}
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=made.id)).volume.id \
        == made.id


def test_a_saved_xml_restores_its_volumes_along_the_chains_their_files_have_now() -> None:
    """libvirt records each disk's backing chain in a saved state's XML (an empty
    `<backingStore/>`: none) and a restore opens only that chain; a clone or a
    snapshot's freeze since put the volume's file on a frozen parent, so the chain
    recorded for a volume disk goes (libvirt looks again), any other disk's stays."""
    chain = ("<backingStore type='file' index='1'><format type='qcow2'/>"
             "<source file='/v/parents/ab.qcow2'/><backingStore/></backingStore>")
    xml = _with_volumes(SAVED_XML)
    own = "<source file='/var/lib/rift/disks/vm_k3v9x2m7.qcow2'/>"
    held = (xml.replace(f'<source file="{WRITTEN.path}" />',
                        f'<source file="{WRITTEN.path}" /><backingStore/>')
            .replace(f'<source file="{READ.path}" />', f'<source file="{READ.path}" />{chain}')
            .replace(own, own + "<backingStore/>"))
    assert held.count("<backingStore/>") == 3 and chain in held
    fresh = without_volume_chains(held)
    assert volume_disks(fresh) == [WRITTEN, READ]
    assert fresh == xml.replace(own, own + "<backingStore/>")  # the VM's own disk keeps it
    assert without_volume_chains(xml) == xml  # nothing recorded: every byte kept
