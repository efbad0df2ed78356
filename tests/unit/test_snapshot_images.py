"""Images made from snapshots (`rift image add NAME --snapshot`) without a guest: the
image's files (the disk flattened with the real qemu-img, standing alone), its
manifest and fixed sizes, the refusals that leave nothing behind, the plan of a
VM (its own overlay of the disk's size, a seed for a qcow2 origin, the state to
start from), and the sizes `rift_vm_new` and pools take from it."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hypervisor.base import ImageError
from hypervisor.qcow2 import qemu_img_info
from hypervisor.snapshot_image import (
    KIND_SNAPSHOT,
    SnapshotSource,
    add_snapshot_image,
    fixed_sizes,
    snapshot_image,
)
from rift.catalog import DirectoryImages
from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.operator import PoolSetIn
from rift.domain.builds import layer_name
from rift.domain.model import Vm
from rift.services.context import Deps, GuestRuntime
from rift.services.lifecycle import pools, tasks, vms
from rift.services.lifecycle.guest_kinds import SnapshotGuest, guest_kind
from tests.support.engine import ALICE, refused
from tests.support.fake_guest import FakeKeys, FakeLifecycle, fake_guests

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img")

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBItiKMb60WRZYHdNAnTB9p/iehwos+LVjLTxu2yyPzL rift"
MIB = 1 << 20


def _source(tmp_path: Path, *, disk: bool = True, origin: str = "kernel") -> SnapshotSource:
    """A snapshot's files as `rift_vm_snapshot` leaves them: a state file, and a
    copy of an overlay whose backing file holds the data."""
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "state").write_bytes(b"LibvirtQemudSave" + b"\0" * 4096)
    (snap / "key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n...\n")
    overlay = None
    if disk:
        base = tmp_path / "base.raw"
        base.write_bytes(b"root" * (MIB // 4))
        base_qcow2 = tmp_path / "base.qcow2"
        from hypervisor.commands import run_command

        run_command(["qemu-img", "convert", "-O", "qcow2", str(base), str(base_qcow2)],
                    timeout_s=30)
        overlay = snap / "disk.qcow2"
        run_command(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                     str(base_qcow2), str(overlay), str(64 * MIB)], timeout_s=30)
    return SnapshotSource(snapshot_id="snap_abcdefgh", image="debian", origin_kind=origin,
                          state=snap / "state", disk=overlay, key=snap / "key",
                          host_key="ssh-ed25519 AAAAhost", vcpus=2, memory_mib=320,
                          disk_gib=3)


def test_the_image_holds_a_flattened_disk_the_state_and_the_key_and_fixes_the_sizes(
        tmp_path: Path) -> None:
    images = tmp_path / "images"
    folder = add_snapshot_image(images, "counting", _source(tmp_path))
    info = qemu_img_info(folder / "disk.qcow2")
    assert "backing-filename" not in info  # it stands alone: the base may go
    assert info["virtual-size"] == 64 * MIB
    (tmp_path / "base.qcow2").unlink()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == KIND_SNAPSHOT
    assert manifest["source"] == {"snapshot_id": "snap_abcdefgh", "image": "debian",
                                  "kind": "kernel"}
    image = snapshot_image(images, "counting")
    assert (image.vcpus, image.memory_mib, image.disk_gib) == (2, 320, 3)
    assert image.disk_bytes == 64 * MIB and image.host_key == "ssh-ed25519 AAAAhost"
    assert (image.key.stat().st_mode & 0o777) == 0o600
    assert fixed_sizes(images, "counting") == (2, 320, 3)
    assert DirectoryImages(images).kind("counting") == "snapshot"
    assert DirectoryImages(images).fixed_sizes("counting") == (2, 320, 3)
    assert DirectoryImages(images).fixed_sizes("debian") is None
    assert DirectoryImages(images).fixed_sizes("../images/counting") is None


def test_an_image_without_a_disk_has_only_the_state_and_the_key(tmp_path: Path) -> None:
    images = tmp_path / "images"
    folder = add_snapshot_image(images, "tinier", _source(tmp_path, disk=False))
    assert sorted(p.name for p in folder.iterdir()) == ["key", "manifest.json", "state"]
    assert snapshot_image(images, "tinier").disk is None


@pytest.mark.parametrize("name, says", [("tiny", "built by Rift"), ("Bad Name", "must match"),
                                        ("taken", "exists already")])
def test_a_reserved_malformed_or_taken_name_is_refused_and_nothing_is_left(
        tmp_path: Path, name: str, says: str) -> None:
    images = tmp_path / "images"
    (images / "taken").mkdir(parents=True)
    with pytest.raises(ImageError, match=says):
        add_snapshot_image(images, name, _source(tmp_path))
    assert sorted(p.name for p in images.iterdir()) == ["taken"]


def test_files_that_cannot_be_copied_leave_no_image(tmp_path: Path) -> None:
    images = tmp_path / "images"
    source = _source(tmp_path)
    source.state.unlink()  # the snapshot went meanwhile
    with pytest.raises(ImageError, match="could not copy"):
        add_snapshot_image(images, "counting", source)
    assert list(images.iterdir()) == []
    with pytest.raises(ImageError, match="no snapshot image"):
        snapshot_image(images, "counting")


class _Keys(FakeKeys):
    def task_key(self, task_id: str) -> str:
        return KEY


def _runtime(tmp_path: Path) -> GuestRuntime:
    return GuestRuntime(images_dir=tmp_path / "images", serial_dir=tmp_path / "serial",
                        boot_timeout_s=5, accel=lambda uri: "qemu")


@pytest.mark.parametrize("origin", ["kernel", "qcow2"])
def test_a_vm_of_the_image_starts_from_its_state_on_an_overlay_of_its_disk(
        tmp_path: Path, origin: str) -> None:
    runtime = _runtime(tmp_path)
    add_snapshot_image(runtime.images_dir, "counting", _source(tmp_path, origin=origin))
    kind = guest_kind("qemu:///system", "counting", runtime, fake_guests(keys=_Keys()))
    assert isinstance(kind, SnapshotGuest) and kind.start_kind == "fork"
    kind.check()
    vm = Vm(id="vm_abcdefgh", task_id="task_abcdefgh", owner="alice", name="x",
            image="counting", status="creating", host="local", vcpus=2, memory_mib=320,
            created_at=None, ssh_host="127.0.0.1", ssh_port=23456)  # type: ignore[arg-type]
    spec = kind.plan(vm)
    assert spec.restore_from == str(runtime.images_dir.resolve() / "counting" / "state")
    assert spec.disk is not None
    info = qemu_img_info(Path(spec.disk))
    assert info["virtual-size"] == 64 * MIB  # what the saved kernel knows
    assert info["backing-filename"] == str(runtime.images_dir.resolve() / "counting" /
                                           "disk.qcow2")
    assert (spec.seed is not None) == (origin == "qcow2")
    kind.clean_up(vm.id)
    assert not Path(spec.disk).exists()


def test_a_vm_of_a_layer_keeps_its_host_key_and_a_vm_of_an_image_gets_its_own(
        tmp_path: Path) -> None:
    """A build's VM of a layer (SPEC §19) is forked keeping its layer's host key and SSH
    server (nothing to wait for before its state is saved); a VM of any other snapshot
    image, a built image among them, gets an identity of its own."""
    runtime = _runtime(tmp_path)
    layer = layer_name("ab" * 32)
    life = FakeLifecycle()
    for number, name in enumerate(("counting", layer)):
        made = tmp_path / name
        made.mkdir()
        add_snapshot_image(runtime.images_dir, name, _source(made, disk=False))
        kind = guest_kind("qemu:///system", name, runtime,
                          fake_guests(keys=_Keys(), lifecycle=life))
        vm = Vm(id=f"vm_abcdefg{'hi'[number]}", task_id="task_abcdefgh", owner="alice",
                name="x", image=name, status="creating", host="local", vcpus=2,
                memory_mib=320, created_at=None, ssh_host="127.0.0.1",
                ssh_port=23456)  # type: ignore[arg-type]
        kind.wait_ready(vm)
    assert life.calls == [("forked", "vm_abcdefgh"), ("layer_forked", "vm_abcdefgi")]


class _Images:
    """A catalog with one snapshot image of fixed sizes."""

    def names(self) -> list[str]:
        return ["counting", "debian", "tiny"]

    def fixed_sizes(self, name: str) -> tuple[int, int, int] | None:
        return (2, 320, 3) if name == "counting" else None


def test_vms_and_pools_of_the_image_take_its_sizes_and_refuse_others(deps: Deps) -> None:
    deps = replace(deps, images=_Images())
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="counting")).vm
    assert (vm.vcpus, vm.memory_mib, vm.disk_gib) == (2, 320, 3)
    same = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="counting", vcpus=2,
               memory_mib=320)).vm
    assert same.memory_mib == 320
    for field, value in (("vcpus", 1), ("memory_mib", 512), ("disk_gib", 10)):
        error = refused("invalid_argument", lambda field=field, value=value: vms.new(
            deps, ALICE, command(c.VmNewIn, handle=handle, image="counting", **{field: value})))
        assert error.details["field"] == field and "leave" in error.message
    pool = pools.set_pool(deps, command(PoolSetIn, image="counting", running=0))
    assert (pool.vcpus, pool.memory_mib) == (2, 320)
    refused("invalid_argument", lambda: pools.set_pool(deps, command(PoolSetIn, image="counting",
                                    running=0, memory_mib=256)))
    other = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    assert (other.vcpus, other.memory_mib) == (1, 256)
