"""A detached volume's files with no guest (hypervisor.volume_content, E2B's volume
content API): its helper process exports the real qcow2 (qemu-storage-daemon, FUSE)
and reads and changes its ext4 with debugfs; what it writes a second call reads,
and what it refuses it names. The door's SDK test: tests/e2e/test_e2b_sandboxes.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hypervisor.base import ImageError
from hypervisor.volume_content import Meta, VolumeContent, clean_path
from hypervisor.volumes import VolumeFolder

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("qemu-storage-daemon", "debugfs", "mkfs.ext4"))
    or not os.path.exists("/dev/fuse") or os.geteuid() != 0,
    reason="needs qemu-storage-daemon, debugfs, mkfs.ext4 and FUSE as root")

HERE = "qemu:///system"


def test_a_detached_volumes_files_are_read_and_written_without_a_guest(
        tmp_path: Path) -> None:
    folder = VolumeFolder(tmp_path / "volumes")
    folder.make(HERE, "vol_aaaaaaaa", 1)
    vol, files = folder.path(HERE, "vol_aaaaaaaa"), VolumeContent()
    made = files.make_dir(HERE, vol, "/src/deep", Meta(mode=0o750, force=True))
    assert (made.type, made.mode, made.path) == ("directory", 0o750, "/src/deep")
    with pytest.raises(FileNotFoundError):
        files.make_dir(HERE, vol, "/a/b", Meta())  # its parent only with force
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    wrote = files.write(HERE, vol, "/src/deep/blob", data, Meta(mode=0o600, uid=1000, gid=7))
    assert (wrote.size, wrote.mode, wrote.uid, wrote.gid) == (len(data), 0o600, 1000, 7)
    assert files.read(HERE, vol, "/src/deep/blob") == data
    with pytest.raises(FileExistsError):
        files.write(HERE, vol, "/src/deep/blob", b"x", Meta())
    assert files.write(HERE, vol, "/src/deep/blob", b"x", Meta(force=True)).mode == 0o600
    listed = files.list(HERE, vol, "/", 3)
    assert [e.path for e in listed] == ["/lost+found", "/src", "/src/deep", "/src/deep/blob"]
    assert [e.path for e in files.list(HERE, vol, "/src", 1)] == ["/src/deep"]
    assert files.set_meta(HERE, vol, "/src", Meta(mode=0o700, uid=5)).uid == 5
    assert files.stat(HERE, vol, "/src").mode == 0o700
    with pytest.raises(FileNotFoundError):
        files.stat(HERE, vol, "/nope")
    with pytest.raises(NotADirectoryError):
        files.list(HERE, vol, "/src/deep/blob", 1)
    with pytest.raises(IsADirectoryError):
        files.read(HERE, vol, "/src")
    files.remove(HERE, vol, "/src")  # with all in it
    assert [e.path for e in files.list(HERE, vol, "/", 3)] == ["/lost+found"]
    with pytest.raises(FileNotFoundError):
        files.remove(HERE, vol, "/")  # the root stays
    with pytest.raises(ImageError):
        files.stat("qemu+ssh://root@h2/system", vol, "/")


class ShHere:
    """A host's SSH that runs each command with this machine's `sh` (and its
    python3, outside Rift's virtualenv), and copies nothing."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def ensure_file(self, target: object, local: Path, *, fresh: bool = False) -> bool:
        return False  # "there" is here

    def run_bytes(self, target: object, command: str, stdin: bytes = b"",
                  timeout_s: float = 120.0, limit: int | None = None) -> bytes:
        import subprocess

        self.ran.append(command)
        done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True,
                              timeout=timeout_s, check=True,
                              env={"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"})
        return done.stdout


def test_a_volume_on_a_host_elsewhere_is_read_and_written_by_the_helper_run_there(
        tmp_path: Path) -> None:
    """The helper goes there as one zip of its modules and runs with that host's
    python3, nothing of Rift installed (rift.guest.host_volume_content)."""
    from typing import Any

    from rift.guest.host_volume_content import HostVolumeContent

    far = "qemu+ssh://root@h2/system"
    folder = VolumeFolder(tmp_path / "volumes")
    folder.make(HERE, "vol_aaaaaaaa", 1)
    vol, links = folder.path(HERE, "vol_aaaaaaaa"), ShHere()
    files = HostVolumeContent(links, tmp_path / "tools")  # type: ignore[arg-type]
    files.make_dir(far, vol, "/far", Meta(force=True))
    files.write(far, vol, "/far/note", b"written there", Meta(mode=0o640))
    there: Any = files.stat(far, vol, "/far/note")
    assert (there.size, there.mode) == (13, 0o640)
    assert files.read(far, vol, "/far/note") == b"written there"
    assert VolumeContent().read(HERE, vol, "/far/note") == b"written there"  # one file
    with pytest.raises(FileNotFoundError):
        files.stat(far, vol, "/nope")
    helper = tmp_path / "tools" / "rift-volume-helper.pyz"
    assert links.ran and all(command == f"python3 {helper}" for command in links.ran)
    before = helper.read_bytes()
    files.stat(HERE, vol, "/far")  # a host here: this machine's own helper process
    assert len(links.ran) == 5 and helper.read_bytes() == before


def test_paths_are_made_absolute_and_normal_and_quotes_refused() -> None:
    assert [clean_path(p) for p in ("//x//y/", "src", "", "/a/../..")] == [
        "/x/y", "/src", "/", "/"]
    for bad in ('/a"b', "/a\\b", "/a\nb"):
        with pytest.raises(ValueError):
            clean_path(bad)


def test_a_volume_whose_journal_needs_replaying_is_read_but_not_written(
        tmp_path: Path) -> None:
    """A guest cut off while it wrote leaves its journal to replay: debugfs would
    write past it, so a write is refused (saying to mount it in a VM once); reads go on."""
    import subprocess

    folder = VolumeFolder(tmp_path / "volumes")
    folder.make(HERE, "vol_aaaaaaaa", 1)
    vol, files = folder.path(HERE, "vol_aaaaaaaa"), VolumeContent()
    files.write(HERE, vol, "/kept", b"before", Meta())
    raw = tmp_path / "v.raw"
    subprocess.run(["qemu-img", "convert", "-q", "-O", "raw", vol, str(raw)], check=True)
    subprocess.run(["debugfs", "-w", "-R", "feature needs_recovery", str(raw)], check=True,
                   capture_output=True)
    subprocess.run(["qemu-img", "convert", "-q", "-O", "qcow2", str(raw), vol], check=True)
    assert files.read(HERE, vol, "/kept") == b"before"
    with pytest.raises(OSError, match="journal needs replaying"):
        files.write(HERE, vol, "/new", b"x", Meta())
