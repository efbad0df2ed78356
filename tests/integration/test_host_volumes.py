"""Volumes' files on a host elsewhere (rift.guest.host_volumes), their shell scripts
run by `sh` on this machine in place of the host's SSH: the same steps as
VolumeFolder's, on the same layout (a file made there is one VolumeFolder reads,
and the other way round), and a host of this machine still VolumeFolder's own.
The real SSH of a host elsewhere: tests/e2e/test_real_hosts.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hypervisor.base import ImageError
from hypervisor.volumes import PARENTS, VolumeFolder
from rift.guest.host_volumes import HostVolumes
from rift.guest.links import HostLinkError, HostLinks, SshTarget

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("qemu-img", "qemu-io", "mkfs.ext4")),
    reason="needs qemu-img, qemu-io and mkfs.ext4 (scripts/libvirt.sh installs them)")

FAR = "qemu+ssh://root@h2/system?no_verify=1"
HERE = "qemu:///system"
A, B, C = "vol_aaaaaaaa", "vol_bbbbbbbb", "vol_cccccccc"


def _info(path: Path) -> dict[str, object]:
    out = subprocess.run(["qemu-img", "info", "-U", "--output=json", str(path)],
                         check=True, capture_output=True, text=True).stdout
    info: dict[str, object] = json.loads(out)
    return info


def _io(path: Path, command: str) -> str:
    """qemu-io's answer; a read's pattern check that fails says so (exit 1)."""
    done = subprocess.run(["qemu-io", "-f", "qcow2", "-c", command, str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 or "Pattern verification failed" in done.stdout, done
    return done.stdout


def _has_ext4(path: Path) -> bool:
    return "53 ef" in _io(path, "read -v 1080 2")  # ext4's magic in its superblock


class ShHere(HostLinks):
    """A host's SSH that runs each command with this machine's `sh`, and counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[tuple[str, str]] = []

    def run(self, target: SshTarget, command: str, timeout_s: float = 120.0) -> str:
        self.ran.append((target.host, command))
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise HostLinkError(done.stderr.strip() or f"exit {done.returncode}")
        return done.stdout


def test_a_host_elsewhere_makes_clones_freezes_and_removes_as_this_machine_does(
        tmp_path: Path) -> None:
    links = ShHere()
    folder = VolumeFolder(tmp_path / "volumes")
    far = HostVolumes(folder, links)
    far.make(FAR, A, 4)
    a = Path(far.path(FAR, A))
    assert a == folder.file(A) and links.ran and links.ran[0][0] == "h2"
    assert _info(a)["virtual-size"] == 4 << 30 and _has_ext4(a)
    assert a.stat().st_blocks * 512 < 64 << 20  # sparse there too
    assert [p.name for p in a.parent.iterdir() if p.name.startswith(".")] == []
    _io(a, "write -P 0x61 1G 1M")
    far.clone(FAR, A, B)
    b = Path(far.path(FAR, B))
    _io(b, "write -P 0x62 1G 1M")  # the clone's writes never reach its source
    assert "Pattern verification failed" not in _io(a, "read -P 0x61 1G 1M")
    far.grow(FAR, A, 6)
    assert _info(a)["virtual-size"] == 6 << 30
    snap = "snap_aaaaaaaa"
    far.freeze(FAR, A, snap)
    assert far.frozen(FAR, snap) == {A: 6} == folder.frozen(HERE, snap)  # one layout
    _io(a, "write -P 0x63 1G 1M")
    far.clone_frozen(FAR, snap, A, C)
    assert "Pattern verification failed" not in _io(Path(far.path(FAR, C)),
                                                    "read -P 0x61 1G 1M")
    with pytest.raises(OSError):
        far.clone_frozen(FAR, snap, B, "vol_dddddddd")  # it keeps no copy of B
    with pytest.raises(ImageError):
        far.path(FAR, "../etc")
    assert far.used_bytes(FAR, A) is None  # not sampled over SSH
    far.thaw(FAR, snap)
    assert far.frozen(FAR, snap) == {}
    for vol in (A, B, C):
        far.remove(FAR, vol)
    assert list((tmp_path / "volumes").iterdir()) == [tmp_path / "volumes" / PARENTS]
    assert list((tmp_path / "volumes" / PARENTS).iterdir()) == []  # every parent gone


def test_a_host_of_this_machine_is_volume_folders_own(tmp_path: Path) -> None:
    links = ShHere()
    here = HostVolumes(VolumeFolder(tmp_path / "volumes"), links)
    here.make(HERE, A, 1)
    assert here.used_bytes(HERE, A) is not None and here.frozen("", "snap_aaaaaaaa") == {}
    here.remove(HERE, A)
    assert links.ran == []  # nothing went through a host's SSH
