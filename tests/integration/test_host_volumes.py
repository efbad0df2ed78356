"""Volumes' files on a host elsewhere (rift.guest.host_volumes), their shell scripts
run by `sh` on this machine in place of the host's SSH: the same steps as
VolumeFolder's, on the same layout (a file made there is one VolumeFolder reads,
and the other way round), and a host of this machine still VolumeFolder's own.
The real SSH of a host elsewhere: tests/e2e/test_real_hosts.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hypervisor.base import ImageError
from hypervisor.volumes import PARENTS, VolumeFolder
from rift.guest.host_volumes import HostVolumes
from rift.guest.links import HostLinkError, HostLinks, SshTarget
from tests.support.qcow2_tools import HERE, NEEDS_TOOLS, A, B, C, has_ext4, qcow2_info, qemu_io

pytestmark = NEEDS_TOOLS
FAR = "qemu+ssh://root@h2/system?no_verify=1"


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
    assert qcow2_info(a)["virtual-size"] == 4 << 30 and has_ext4(a)
    assert a.stat().st_blocks * 512 < 64 << 20  # sparse there too
    assert [p.name for p in a.parent.iterdir() if p.name.startswith(".")] == []
    qemu_io(a, "write -P 0x61 1G 1M")
    far.clone(FAR, A, B)
    b = Path(far.path(FAR, B))
    qemu_io(b, "write -P 0x62 1G 1M")  # the clone's writes never reach its source
    assert "Pattern verification failed" not in qemu_io(a, "read -P 0x61 1G 1M")
    far.grow(FAR, A, 6)
    assert qcow2_info(a)["virtual-size"] == 6 << 30
    snap = "snap_aaaaaaaa"
    far.freeze(FAR, A, snap)
    assert far.frozen(FAR, snap) == {A: 6} == folder.frozen(HERE, snap)  # one layout
    qemu_io(a, "write -P 0x63 1G 1M")
    far.clone_frozen(FAR, snap, A, C)
    assert "Pattern verification failed" not in qemu_io(Path(far.path(FAR, C)),
                                                    "read -P 0x61 1G 1M")
    with pytest.raises(OSError):
        far.clone_frozen(FAR, snap, B, "vol_dddddddd")  # it keeps no copy of B
    with pytest.raises(ImageError):
        far.path(FAR, "../etc")
    # what its file and its chain take, read there as here
    assert far.used_bytes(FAR, A) == folder.used_bytes(HERE, A) > 1 << 20
    assert far.used_bytes(FAR, "vol_dddddddd") is None  # no file
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
