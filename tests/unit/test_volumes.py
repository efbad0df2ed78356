"""Volumes (SPEC §18) against fakes: the rows, the one-writer rule, the paths, the
refusals, the disk budget, and what a VM's end does; the files and mounts are
recorded by fakes of their ports, the disks plugged by the fake hypervisor."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock, iso
from rift.domain.errors import IllegalTransition, VolumeBusy
from rift.domain.volumes import Attachment, Volume, check_attachable, mount_path
from rift.services.context import Deps
from rift.services.lifecycle import pauses, tasks, vms, volume_attach, volumes
from tests.support.engine import ALICE, BOB, event_types, refused
from tests.support.volumes import Files, Mounts
from tests.support.volumes import attach as _attach
from tests.support.volumes import new_vm as _vm
from tests.support.volumes import new_volume as _volume

NOW = datetime(2026, 12, 5, tzinfo=UTC)


@pytest.fixture
def vdeps(deps: Deps) -> Deps:
    return replace(deps, volume_files=Files(), mounts=Mounts())


def test_a_volume_is_made_listed_read_and_deleted_with_its_file(vdeps: Deps) -> None:
    files: Files = vdeps.volume_files  # type: ignore[assignment]
    made = volumes.new(vdeps, ALICE, command(c.VolumeNewIn, name="work", size_gib=4)).volume
    assert made.id.startswith("vol_") and (made.name, made.size_gib, made.host) == (
        "work", 4, "local")
    assert files.made == {made.id: 4}
    listed = volumes.list_volumes(vdeps, ALICE, command(c.VolumeListIn)).volumes
    assert [v.id for v in listed] == [made.id]
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=made.id)).volume == made
    assert volumes.list_volumes(vdeps, BOB, command(c.VolumeListIn)).volumes == []
    volumes.delete(vdeps, ALICE, command(c.VolumeIdIn, volume_id=made.id))
    assert files.made == {}
    refused("volume_not_found", volumes.get, vdeps, ALICE,
            command(c.VolumeIdIn, volume_id=made.id))


def test_another_users_volume_is_not_found_as_an_unknown_one_is(vdeps: Deps) -> None:
    vol = _volume(vdeps)
    _, bob_handle, bob_vm = _vm(vdeps, BOB)
    theirs = refused("volume_not_found", volumes.get, vdeps, BOB,
                     command(c.VolumeIdIn, volume_id=vol))
    unknown = refused("volume_not_found", volumes.get, vdeps, BOB,
                      command(c.VolumeIdIn, volume_id="vol_aaaaaaaa"))
    assert theirs.message.replace(vol, "X") == unknown.message.replace("vol_aaaaaaaa", "X")
    refused("volume_not_found", volumes.delete, vdeps, BOB, command(c.VolumeIdIn, volume_id=vol))
    refused("volume_not_found", _attach, vdeps, bob_handle, bob_vm, vol, caller=BOB)


def test_a_name_is_unique_per_user(vdeps: Deps) -> None:
    _volume(vdeps, "work")
    err = refused("invalid_argument", _volume, vdeps, "work")
    assert err.details["field"] == "name"
    _volume(vdeps, "work", caller=BOB)


def test_an_attached_volume_is_plugged_mounted_and_listed_on_the_vm(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    vm = _attach(vdeps, handle, vm_id, vol, "/work/repo/").vm
    assert [(m.volume_id, m.path, m.read_only) for m in vm.volumes] == [
        (vol, "/work/repo", False)]
    disk = local_hv.domains[f"rift-{vm_id}"].disks[vol]
    assert (disk.path, disk.target, disk.read_only) == (f"/volumes/{vol}.qcow2", "vdc", False)
    mounts: Mounts = vdeps.mounts  # type: ignore[assignment]
    assert mounts.mounted == {(vm_id, "/work/repo"): (vol, False)}
    got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume
    assert [(a.vm_id, a.task_id, a.path) for a in got.attached_to] == [
        (vm_id, task_id, "/work/repo")]
    assert event_types(vdeps, task_id)[-1] == "volume_attached"
    assert [m.volume_id for m in vms.get(vdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)
                                         ).vm.volumes] == [vol]
    task = tasks.get(vdeps, ALICE, command(c.TaskGetIn, handle=handle)).task
    assert [m.volume_id for m in task.vms[0].volumes] == [vol]


def test_one_writer_or_many_readers(vdeps: Deps) -> None:
    vol, shared = _volume(vdeps, "a"), _volume(vdeps, "b")
    task_1, h1, vm_1 = _vm(vdeps)
    _, h2, vm_2 = _vm(vdeps)
    _attach(vdeps, h1, vm_1, vol)
    second = refused("volume_busy", _attach, vdeps, h2, vm_2, vol)
    assert (second.details["vm_id"], second.details["task_id"]) == (vm_1, task_1)
    assert vm_1 in second.message and task_1 in second.message
    refused("volume_busy", _attach, vdeps, h2, vm_2, vol, read_only=True)
    _attach(vdeps, h1, vm_1, shared, "/shared", read_only=True)
    _attach(vdeps, h2, vm_2, shared, "/shared", read_only=True)
    refused("volume_busy", _attach, vdeps, h2, vm_2, vol, "/other")
    writer = _vm(vdeps)
    refused("volume_busy", _attach, vdeps, writer[1], writer[2], shared, "/s")


def test_paths_must_be_absolute_and_outside_the_guests_system(vdeps: Deps) -> None:
    _, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    for bad in ("/", "//", "/proc", "/sys/x", "/dev/vdc", "/boot", "/usr/local", "/etc",
                "/etc/x", "/data/../etc", "/a b", "/./"):
        err = refused("invalid_argument", _attach, vdeps, handle, vm_id, vol, bad)
        assert err.details["field"] == "path", bad
    with pytest.raises(Exception, match="absolute"):
        command(c.VmAttachVolumeIn, handle=handle, vm_id=vm_id, volume_id=vol, path="data")
    assert mount_path("/usrdata/./x/") == "/usrdata/x"
    _attach(vdeps, handle, vm_id, vol, "/usrdata")


def test_a_paused_vm_is_not_running_and_nothing_is_plugged(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    pauses.pause(vdeps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    refused("vm_not_running", _attach, vdeps, handle, vm_id, vol)
    assert local_hv.domains[f"rift-{vm_id}"].disks == {}
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.attached_to \
        == []


def test_delete_while_attached_names_the_vm_and_the_detach(vdeps: Deps,
                                                          local_hv: FakeHypervisor) -> None:
    task_id, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    _attach(vdeps, handle, vm_id, vol)
    err = refused("volume_busy", volumes.delete, vdeps, ALICE,
                  command(c.VolumeIdIn, volume_id=vol))
    assert "rift_vm_detach_volume" in err.hint and vm_id in err.message
    vm = volume_attach.detach(vdeps, ALICE, command(c.VmDetachVolumeIn, handle=handle,
                                                    vm_id=vm_id, volume_id=vol)).vm
    assert vm.volumes == [] and local_hv.domains[f"rift-{vm_id}"].disks == {}
    assert (vdeps.mounts.mounted == {})  # type: ignore[attr-defined]
    assert event_types(vdeps, task_id)[-1] == "volume_detached"
    again = volume_attach.detach(vdeps, ALICE, command(c.VmDetachVolumeIn, handle=handle,
                                                       vm_id=vm_id, volume_id=vol)).vm
    assert again.volumes == []
    volumes.delete(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol))


def test_destroy_and_close_detach_and_never_delete(vdeps: Deps) -> None:
    task_id, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    _attach(vdeps, handle, vm_id, vol)
    vms.destroy(vdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=vm_id))
    assert (vdeps.mounts.mounted == {})  # type: ignore[attr-defined]  # unmounted first
    assert "volume_detached" in event_types(vdeps, task_id)
    got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume
    assert got.attached_to == []
    _, handle_2, vm_2 = _vm(vdeps)
    _attach(vdeps, handle_2, vm_2, vol)
    tasks.close(vdeps, ALICE, command(c.TaskCloseIn, handle=handle_2))
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.attached_to \
        == []
    assert vol in vdeps.volume_files.made  # type: ignore[attr-defined]


def test_a_failed_mount_unplugs_the_disk_and_leaves_no_attachment(
        vdeps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle, vm_id = _vm(vdeps)
    vol = _volume(vdeps)
    vdeps.mounts.refuse = True  # type: ignore[attr-defined]
    refused("invalid_argument", _attach, vdeps, handle, vm_id, vol)
    assert local_hv.domains[f"rift-{vm_id}"].disks == {}
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.attached_to \
        == []
    local_hv.fail_next("attach", "internal error: unable to execute QEMU command")
    vdeps.mounts.refuse = False  # type: ignore[attr-defined]
    refused("hypervisor_error", _attach, vdeps, handle, vm_id, vol)
    _attach(vdeps, handle, vm_id, vol)


def test_a_volume_grows_only_and_only_while_detached(vdeps: Deps) -> None:
    vol = _volume(vdeps, size_gib=4)
    err = refused("invalid_argument", volumes.resize, vdeps, ALICE,
                  command(c.VolumeResizeIn, volume_id=vol, size_gib=3))
    assert err.details["field"] == "size_gib"
    grown = volumes.resize(vdeps, ALICE, command(c.VolumeResizeIn, volume_id=vol, size_gib=6))
    assert grown.volume.size_gib == 6 and vdeps.volume_files.made[vol] == 6  # type: ignore[attr-defined]
    _, handle, vm_id = _vm(vdeps)
    _attach(vdeps, handle, vm_id, vol)
    refused("volume_busy", volumes.resize, vdeps, ALICE,
            command(c.VolumeResizeIn, volume_id=vol, size_gib=8))


def test_a_clone_is_a_new_volume_of_its_parent_refused_while_written(vdeps: Deps) -> None:
    vol = _volume(vdeps, size_gib=4)
    made = volumes.clone(vdeps, ALICE, command(c.VolumeCloneIn, volume_id=vol,
                                               name="copy")).volume
    assert (made.parent_id, made.size_gib, made.name) == (vol, 4, "copy")
    assert ("clone", vol, made.id) in vdeps.volume_files.calls  # type: ignore[attr-defined]
    _, handle, vm_id = _vm(vdeps)
    _attach(vdeps, handle, vm_id, vol)
    refused("volume_busy", volumes.clone, vdeps, ALICE,
            command(c.VolumeCloneIn, volume_id=vol, name="other"))


def test_volume_bytes_count_against_the_disk_budget(make_deps: object) -> None:
    deps = replace(make_deps(max_disk_gib_per_user=10), volume_files=Files(),  # type: ignore[operator]
                   mounts=Mounts())
    vol = _volume(deps, "a", 8)
    err = refused("quota_exceeded", _volume, deps, "b", 3)
    assert err.details["limit"] == 10
    refused("quota_exceeded", volumes.clone, deps, ALICE,
            command(c.VolumeCloneIn, volume_id=vol, name="c"))
    refused("quota_exceeded", volumes.resize, deps, ALICE,
            command(c.VolumeResizeIn, volume_id=vol, size_gib=11))
    _volume(deps, "b", 2)
    _volume(deps, "b", 2, caller=BOB)


def test_the_state_machines_refuse_what_they_do_not_start_from() -> None:
    vol = Volume("vol_aaaaaaaa", "alice", "w", 4, "local", "making", NOW)
    ready = vol.made()
    assert ready.state == "ready" and ready.grown(5).size_gib == 5
    with pytest.raises(IllegalTransition):
        ready.made()
    with pytest.raises(IllegalTransition):
        vol.deleting()
    assert ready.deleting().removed().state == "deleting"
    with pytest.raises(IllegalTransition):
        ready.removed()
    att = Attachment("vol_aaaaaaaa", "vm_aaaaaaaa", "task_aaaaaaaa", "/d", False, "vdc",
                     "attaching", NOW)
    with pytest.raises(IllegalTransition):
        att.detaching()
    done = att.attached()
    assert done.detaching().kept() == done
    with pytest.raises(VolumeBusy):
        check_attachable(ready, [done], read_only=True)
    check_attachable(ready, [replace(done, read_only=True)], read_only=True)


def test_a_volume_goes_to_a_host_that_takes_vms_this_machines_first(vdeps: Deps) -> None:
    """A host of this machine takes a new volume before one elsewhere (first by name);
    with it drained, the host elsewhere does, where its file is made (through the
    VolumeFiles port, named by its URI); with none taking VMs, `no_capacity`."""
    from rift.services.operator import hosts

    far = "qemu+ssh://root@h2/system?no_verify=1"
    hosts.add_host(vdeps, "aaa-elsewhere", far, hosts.HostSize(4, 4096))
    assert volumes.new(vdeps, ALICE, command(c.VolumeNewIn, name="w", size_gib=1)
                       ).volume.host == "local"
    hosts.drain_host(vdeps, "local")
    there = volumes.new(vdeps, ALICE, command(c.VolumeNewIn, name="x", size_gib=1)).volume
    assert there.host == "aaa-elsewhere"
    assert ("make", there.id) in vdeps.volume_files.calls  # type: ignore[attr-defined]
    hosts.drain_host(vdeps, "aaa-elsewhere")
    refused("no_capacity", _volume, vdeps, "other")


def test_a_volume_on_a_host_elsewhere_that_does_not_answer_waits_for_it(
        vdeps: Deps, clock: FakeClock) -> None:
    """Its file is on that host's machine: a VM that would hold it is refused naming
    the host, before and after RIFT_HOST_LOST_S alike, and it is never taken to
    another host."""
    from rift.services.background.reconcile import mark_unreachable
    from rift.services.operator import hosts

    hosts.add_host(vdeps, "far", "qemu+ssh://root@h2/system?no_verify=1",
                   hosts.HostSize(64, 1_000_000))
    hosts.drain_host(vdeps, "local")
    vol = _volume(vdeps)
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.host \
        == "far"
    hosts.drain_host(vdeps, "local", drained=False)
    mark_unreachable(vdeps, "far", "connection refused")
    _, handle, _ = _vm(vdeps)
    for _ in range(2):
        down = refused("no_capacity", vms.new, vdeps, ALICE, command(
            c.VmNewIn, handle=handle, image="tiny", volumes=[{"volume_id": vol,
                                                               "path": "/w"}]))
        assert "host far" in down.message and "waits for it" in down.hint
        clock.advance(vdeps.limits.host_lost_s)  # lost: still its host's
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.host \
        == "far"


def test_a_volume_says_its_host_is_unreachable_and_keeps_its_host_from_removal(
        vdeps: Deps, clock: FakeClock) -> None:
    from rift.services.background.reconcile import mark_reachable, mark_unreachable
    from rift.services.operator import hosts

    vol = _volume(vdeps)
    mark_unreachable(vdeps, "local", "connection refused")
    got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume
    assert got.host_unreachable_since == iso(clock.now())
    (listed,) = volumes.list_volumes(vdeps, ALICE, command(c.VolumeListIn)).volumes
    assert listed.host_unreachable_since == got.host_unreachable_since
    mark_reachable(vdeps, "local")
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)
                       ).volume.host_unreachable_since is None
    kept = refused("invalid_argument", hosts.remove_host, vdeps, "local")
    assert "1 volumes" in kept.message and "rift_volume_delete" in kept.message


def test_drain_move_leaves_a_vm_holding_volumes_when_no_host_of_this_machine_takes_it(
        vdeps: Deps) -> None:
    """Volumes' files stay on this machine: with the only other host of it drained and
    one elsewhere taking VMs, a VM holding volumes stays (saying why), the others go
    elsewhere, and the volumes stay too."""
    from rift.services.operator import hosts
    from rift.services.operator.moves import drain_and_move

    hosts.add_host(vdeps, "far", "fake:///far", hosts.HostSize(64, 1_000_000))  # most room
    _, handle, holder = _vm(vdeps)
    _, _, free = _vm(vdeps)
    vol = _volume(vdeps)  # on far too: the first host by name
    _attach(vdeps, handle, holder, vol)
    hosts.drain_host(vdeps, "local")
    hosts.add_host(vdeps, "remote", "fake+ssh://hv9/system", hosts.HostSize(8, 8192))
    report = drain_and_move(vdeps, "far")
    assert report.moved == [(free, "remote")] and not report.failed and not report.volumes
    ((stayed, why),) = report.stayed
    assert stayed == holder and "no other host" in why and "rift_vm_detach_volume" in why
    assert vms.get(vdeps, ALICE, command(c.VmGetIn, vm_id=holder)).vm.host == "far"
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.host \
        == "far"


def test_a_volume_on_a_host_that_does_not_answer_waits_then_goes_where_vms_run(
        vdeps: Deps, clock: FakeClock) -> None:
    """While its host does not answer, a VM that would hold it is refused naming the
    host, since when and when it is lost, and delete, grow and clone work (its file is
    on this machine); once the host is lost, the next VM takes it to a host that
    answers, for rift_vm_new and for an attach alike."""
    from datetime import timedelta

    from rift.services.background.reconcile import mark_unreachable
    from rift.services.operator import hosts

    hosts.add_host(vdeps, "aaa", "fake:///aaa", hosts.HostSize(64, 1_000_000))
    vol, other = _volume(vdeps, "work"), _volume(vdeps, "other")  # on aaa: first by name
    mark_unreachable(vdeps, "aaa", "connection refused")
    since = iso(clock.now())
    _, handle, vm_id = _vm(vdeps)  # on local: aaa takes no VM now
    down = refused("no_capacity", vms.new, vdeps, ALICE, command(
        c.VmNewIn, handle=handle, image="tiny", volumes=[{"volume_id": vol, "path": "/w"}]))
    lost_at = iso(clock.now() + timedelta(seconds=vdeps.limits.host_lost_s))
    assert f"host aaa, which has not answered since {since}" in down.message
    assert f"after {lost_at} (RIFT_HOST_LOST_S)" in down.hint
    refused("no_capacity", _attach, vdeps, handle, vm_id, vol)
    volumes.resize(vdeps, ALICE, command(c.VolumeResizeIn, volume_id=other, size_gib=6))
    copy = volumes.clone(vdeps, ALICE, command(c.VolumeCloneIn, volume_id=other,
                                               name="copy")).volume
    assert copy.host == "aaa"
    volumes.delete(vdeps, ALICE, command(c.VolumeIdIn, volume_id=copy.id))

    clock.advance(vdeps.limits.host_lost_s)
    made = vms.new(vdeps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", volumes=[
        {"volume_id": vol, "path": "/w"}])).vm
    assert made.host == "local" and [m.volume_id for m in made.volumes] == [vol]
    assert volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol)).volume.host \
        == "local"
    attached = _attach(vdeps, handle, vm_id, other, "/o").vm
    assert [m.volume_id for m in attached.volumes] == [other]
    got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=other)).volume
    assert (got.host, got.host_unreachable_since) == ("local", None)
