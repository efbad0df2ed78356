"""`rift image add` and a VM's own files with the real tools (qemu-img,
genisoimage), on small empty images: no guest boots here (that is
tests/e2e/test_real_qcow2.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hypervisor.base import ImageError
from hypervisor.disks import iso_maker, seed_files
from hypervisor.qcow2 import (
    add_qcow2,
    prepare_vm_disks,
    qcow2_image,
    qemu_img_info,
    remove_image,
)
from rift.domain.model import Vm
from rift.guest.adapter import ssh_guests
from rift.services.context import GuestRuntime
from rift.services.lifecycle.guest_kinds import Qcow2Guest, VmFiles

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBItiKMb60WRZYHdNAnTB9p/iehwos+LVjLTxu2yyPzL rift"


def _missing() -> str | None:
    if shutil.which("qemu-img") is None:
        return "no qemu-img (scripts/libvirt.sh installs qemu-utils)"
    try:
        iso_maker()
    except ImageError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _qcow2(path: Path, size: str = "64M", *extra: str) -> Path:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *extra, str(path), size],
                   check=True, timeout=60)
    return path


def test_an_added_qcow2_is_copied_read_only_with_its_manifest(tmp_path: Path) -> None:
    source = _qcow2(tmp_path / "src.qcow2")
    folder = add_qcow2(tmp_path / "images", "bookworm", source)
    disk = folder / "disk.qcow2"
    assert disk.read_bytes() == source.read_bytes() and not disk.stat().st_mode & 0o222
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "qcow2" and manifest["name"] == "bookworm"
    assert manifest["disk"]["virtual_size"] == 64 << 20
    assert manifest["disk"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert manifest["added_at"] and manifest["source"] == str(source)
    assert qcow2_image(tmp_path / "images", "bookworm").disk == disk.resolve()
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["bookworm"]  # no leftovers


@pytest.mark.parametrize(("name", "why"), [
    ("tiny", "built by Rift"),
    ("debian", "built by Rift"),
    ("Debian", "must match"),
    ("../up", "must match"),
    ("taken", "exists already"),
])
def test_reserved_malformed_and_taken_names_are_refused(tmp_path: Path, name: str,
                                                        why: str) -> None:
    source = _qcow2(tmp_path / "src.qcow2")
    add_qcow2(tmp_path / "images", "taken", source)
    with pytest.raises(ImageError, match=why):
        add_qcow2(tmp_path / "images", name, source)


def test_a_raw_file_or_an_overlay_is_refused(tmp_path: Path) -> None:
    raw = tmp_path / "disk.img"
    raw.write_bytes(b"\0" * 65536)
    with pytest.raises(ImageError, match="raw, not qcow2"):
        add_qcow2(tmp_path / "images", "raw", raw)
    base = _qcow2(tmp_path / "base.qcow2")
    overlay = _qcow2(tmp_path / "overlay.qcow2", "64M", "-F", "qcow2", "-b", str(base))
    with pytest.raises(ImageError, match="backing file"):
        add_qcow2(tmp_path / "images", "overlay", overlay)
    with pytest.raises(ImageError, match="not a file"):
        add_qcow2(tmp_path / "images", "none", tmp_path / "absent.qcow2")
    assert not (tmp_path / "images").exists() or not list((tmp_path / "images").iterdir())


def test_a_vm_gets_an_overlay_on_the_image_and_a_cidata_seed(tmp_path: Path) -> None:
    add_qcow2(tmp_path / "images", "bookworm", _qcow2(tmp_path / "src.qcow2"))
    image = qcow2_image(tmp_path / "images", "bookworm")
    before = image.disk.read_bytes()
    disks = prepare_vm_disks(image, tmp_path / "disks", vm_id="vm_abcdefgh",
                             public_key_line=KEY)
    info = qemu_img_info(disks.overlay)
    assert info["format"] == "qcow2" and info["backing-filename"] == str(image.disk)
    assert info["virtual-size"] == image.virtual_size
    iso = disks.seed.read_bytes()
    assert iso[0x8001:0x8006] == b"CD001"  # an ISO 9660 primary volume descriptor
    assert iso[0x8028:0x8048].decode().strip() == "cidata"  # the label NoCloud looks for
    for data in seed_files("vm_abcdefgh", KEY).values():
        assert data in iso
    assert image.disk.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "disks").iterdir()) == [
        "vm_abcdefgh-seed.iso", "vm_abcdefgh.qcow2"]


def test_a_vm_overlay_on_a_qcow2_image_is_its_disk_gib_never_smaller_than_the_image(
        tmp_path: Path) -> None:
    add_qcow2(tmp_path / "images", "bookworm", _qcow2(tmp_path / "src.qcow2", "2G"))
    runtime = GuestRuntime(images_dir=tmp_path / "images", serial_dir=tmp_path / "serial",
                           boot_timeout_s=5, accel=lambda uri: "qemu",
                           disks_dir=tmp_path / "disks")
    kind = Qcow2Guest("qemu:///system", "bookworm", runtime, ssh_guests(tmp_path / "keys"),
                      VmFiles(runtime))
    for vm_id, disk_gib, size in (("vm_aaaaaaaa", 3, 3 << 30), ("vm_bbbbbbbb", 1, 2 << 30)):
        vm = Vm(id=vm_id, task_id="task_abcdefgh", owner="alice", name="box",
                image="bookworm", status="creating", host="local", vcpus=1, memory_mib=256,
                created_at=datetime.now(UTC), ssh_host="127.0.0.1", ssh_port=20022,
                disk_gib=disk_gib)
        spec = kind.plan(vm)
        assert spec.disk is not None
        info = qemu_img_info(Path(spec.disk))
        assert info["virtual-size"] == size, (disk_gib, info)
        assert Path(spec.disk).stat().st_blocks * 512 < 1 << 20  # sparse
    assert qcow2_image(tmp_path / "images", "bookworm").virtual_size == 2 << 30


def test_remove_takes_the_image_out_of_the_catalog_and_keeps_tiny(tmp_path: Path) -> None:
    add_qcow2(tmp_path / "images", "bookworm", _qcow2(tmp_path / "src.qcow2"))
    remove_image(tmp_path / "images", "bookworm")
    assert list((tmp_path / "images").iterdir()) == []
    with pytest.raises(ImageError, match="no image"):
        remove_image(tmp_path / "images", "bookworm")
    with pytest.raises(ImageError, match="Rift's own"):
        remove_image(tmp_path / "images", "tiny")


def test_the_cli_adds_lists_and_removes_an_image(tmp_path: Path) -> None:
    env = {"RIFT_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           "RIFT_HYPERVISOR_URI": "test:///default"}

    def rift(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rift.cli", *argv], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    source = _qcow2(tmp_path / "src.qcow2")
    added = rift("image", "add", "bookworm", str(source))
    assert added.returncode == 0, added.stderr
    again = rift("image", "add", "bookworm", str(source))
    assert again.returncode == 1 and "exists already" in again.stderr
    listed = json.loads(rift("image", "list", "--json").stdout)
    assert {r["name"]: (r["kind"], r["built"]) for r in listed} == {
        "bookworm": ("qcow2", "yes"), "debian": ("kernel", "no"), "tiny": ("kernel", "no")}
    assert "qcow2" in rift("image", "list").stdout
    removed = rift("image", "remove", "bookworm")
    assert removed.returncode == 0, removed.stderr
    assert [r["name"] for r in json.loads(rift("image", "list", "--json").stdout)] == [
        "debian", "tiny"]
