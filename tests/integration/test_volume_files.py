"""Volumes' files with the real tools (mkfs.ext4, qemu-img, qemu-io), no guest: a
new volume is a sparse qcow2 holding ext4, a clone is a copy-on-write child in
constant time whose writes never reach its source (nor the source's its), a
volume grows, and a frozen parent goes with its last child."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hypervisor.base import ImageError, VolumeDisk
from hypervisor.volumes import PARENTS, VolumeFolder, disk_xml, make_stand_in
from tests.support.qcow2_tools import HERE, NEEDS_TOOLS, A, B, C, has_ext4, qcow2_info, qemu_io

pytestmark = NEEDS_TOOLS


def test_a_volume_is_sparse_ext4_and_its_clone_goes_its_own_way(tmp_path: Path) -> None:
    folder = VolumeFolder(tmp_path / "volumes")
    folder.make(HERE, A, 10)
    a = Path(folder.path(HERE, A))
    info = qcow2_info(a)
    assert (info["format"], info["virtual-size"]) == ("qcow2", 10 << 30)
    assert a.stat().st_blocks * 512 < 64 << 20  # sparse: a few MiB of ext4's own
    assert has_ext4(a)
    qemu_io(a, "write -P 0x61 512M 1M")

    began = time.monotonic()
    folder.clone(HERE, A, B)
    took = time.monotonic() - began
    b = Path(folder.path(HERE, B))
    assert took < 2, took  # two links and two empty overlays, whatever the size
    assert "Pattern verification failed" not in qemu_io(b, "read -P 0x61 512M 1M")  # it sees it
    qemu_io(b, "write -P 0x62 512M 1M")
    qemu_io(a, "write -P 0x63 513M 1M")
    assert "Pattern verification failed" not in qemu_io(a, "read -P 0x61 512M 1M")
    assert "Pattern verification failed" not in qemu_io(b, "read -P 0x62 512M 1M")
    assert "Pattern verification failed" in qemu_io(b, "read -P 0x63 513M 1M")
    parents = list((tmp_path / "volumes" / PARENTS).iterdir())
    assert len(parents) == 2 and parents[0].stat().st_ino == parents[1].stat().st_ino

    folder.grow(HERE, B, 12)
    assert qcow2_info(b)["virtual-size"] == 12 << 30
    folder.clone(HERE, B, C)  # a chain: C on B's frozen file on A's
    folder.remove(HERE, A)
    assert has_ext4(Path(folder.path(HERE, C)))
    folder.remove(HERE, B)
    assert len(list((tmp_path / "volumes" / PARENTS).iterdir())) == 2  # C's chain
    folder.remove(HERE, C)
    assert list((tmp_path / "volumes" / PARENTS).iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "volumes").iterdir()) == [PARENTS]
    folder.remove(HERE, C)  # absent is fine


def test_a_volume_file_is_named_by_its_id_only_and_on_this_machine_only(
        tmp_path: Path) -> None:
    folder = VolumeFolder(tmp_path)
    with pytest.raises(ImageError):
        folder.path(HERE, "../vol_aaaaaaaa")
    with pytest.raises(ImageError, match="this machine"):
        folder.path("qemu+ssh://root@h2/system", A)


def test_the_disk_xml_names_the_volume_as_its_serial_and_is_read_only_when_asked() -> None:
    xml = disk_xml(VolumeDisk("/v/vol_aaaaaaaa.qcow2", "vdc", A, read_only=True))
    assert "<serial>vol_aaaaaaaa</serial>" in xml and "<readonly />" in xml
    assert "<target dev=\"vdc\" bus=\"virtio\" />" in xml
    assert "readonly" not in disk_xml(VolumeDisk("/v/x.qcow2", "vdd", A))


def test_a_forks_stand_in_is_an_empty_qcow2_the_volumes_size(tmp_path: Path) -> None:
    folder = VolumeFolder(tmp_path / "volumes")
    folder.make(HERE, A, 3)
    qemu_io(Path(folder.path(HERE, A)), "write -P 0x5a 0 1M")
    stand_in = tmp_path / ".stand-in-rift-vm_fork0001-vdc.qcow2"
    make_stand_in(folder.path(HERE, A), str(stand_in))
    info = qcow2_info(stand_in)
    assert (info["format"], info["virtual-size"]) == ("qcow2", 3 << 30)
    assert "backing-filename" not in info  # nothing of the volume reaches it
    assert "Pattern verification failed" in qemu_io(stand_in, "read -P 0x5a 0 1M")


def test_used_bytes_counts_what_is_written_and_the_parents_a_clone_reads(
        tmp_path: Path) -> None:
    folder = VolumeFolder(tmp_path / "volumes")
    assert folder.used_bytes(HERE, A) is None  # no file yet
    folder.make(HERE, A, 10)
    empty = folder.used_bytes(HERE, A)
    assert empty is not None and 0 < empty < 64 << 20  # ext4's own, not the 10 GiB
    qemu_io(Path(folder.path(HERE, A)), "write -P 0x61 512M 32M")  # past ext4's own
    written = folder.used_bytes(HERE, A)
    assert written is not None and written - empty >= 32 << 20
    folder.clone(HERE, A, B)
    own = Path(folder.path(HERE, B)).stat().st_blocks * 512
    assert own < 4 << 20  # an empty overlay …
    assert folder.used_bytes(HERE, B) == own + written  # … on the parent it reads
    with pytest.raises(ImageError, match="this machine"):
        folder.used_bytes("qemu+ssh://root@h2/system", A)


def test_a_frozen_volume_is_cloned_as_it_was_and_goes_with_its_snapshot(
        tmp_path: Path) -> None:
    """freeze (a VM snapshot's), clone_frozen, thaw: the volume goes on writable on
    a new overlay; the clone reads what was there at the freeze whatever the volume
    wrote since or whether it is gone; thaw and the last child take the files."""
    folder, snap = VolumeFolder(tmp_path / "volumes"), "snap_aaaaaaaa"
    parents = tmp_path / "volumes" / PARENTS
    folder.make(HERE, A, 4)
    a = Path(folder.path(HERE, A))
    qemu_io(a, "write -P 0x61 1G 1M")
    began = time.monotonic()
    folder.freeze(HERE, A, snap)
    assert time.monotonic() - began < 2  # two links and one empty overlay
    assert folder.frozen(HERE, snap) == {A: 4} and folder.frozen(HERE, "snap_bbbbbbbb") == {}
    qemu_io(a, "write -P 0x62 1G 1M")  # the volume goes on writable
    folder.grow(HERE, A, 6)
    folder.remove(HERE, A)
    assert folder.frozen(HERE, snap) == {A: 4}  # kept though the volume is gone
    folder.clone_frozen(HERE, snap, A, B)
    b = Path(folder.path(HERE, B))
    assert qcow2_info(b)["virtual-size"] == 4 << 30 and has_ext4(b)
    assert "Pattern verification failed" not in qemu_io(b, "read -P 0x61 1G 1M")
    with pytest.raises(FileNotFoundError):
        folder.clone_frozen(HERE, snap, C, "vol_dddddddd")  # it keeps no C
    with pytest.raises(ImageError):
        folder.thaw("", "../etc")
    folder.thaw("", snap)
    assert folder.frozen(HERE, snap) == {}
    assert "Pattern verification failed" not in qemu_io(b, "read -P 0x61 1G 1M")
    folder.remove(HERE, B)
    assert list(parents.iterdir()) == []  # nothing left of A, its freeze or B


def test_a_new_volume_has_its_inode_tables_zeroed_so_no_guest_zeroes_them(
        tmp_path: Path) -> None:
    """Every block group's inode table is marked zeroed (ITABLE_ZEROED), so a guest's
    kernel starts no ext4lazyinit writes after its first mount; the file stays small."""
    if shutil.which("dumpe2fs") is None:
        pytest.skip("needs dumpe2fs")
    folder = VolumeFolder(tmp_path / "volumes")
    folder.make(HERE, A, 4)
    a = Path(folder.path(HERE, A))
    assert a.stat().st_blocks * 512 < 16 << 20
    raw = tmp_path / "a.raw"
    subprocess.run(["qemu-img", "convert", "-q", "-O", "raw", str(a), str(raw)], check=True)
    listed = subprocess.run(["dumpe2fs", str(raw)], check=True, capture_output=True,
                            text=True).stdout.splitlines()
    groups = [line for line in listed if re.match(r"Group \d+: ", line)]
    assert len(groups) == 32 and all("ITABLE_ZEROED" in g for g in groups), groups
