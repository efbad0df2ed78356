"""Volumes on a host (SPEC §18): each a sparse qcow2 file with ext4 inside, in a
folder of the data dir (`volumes/`), and the disk device XML that hot-plugs one.

- **make**: a sparse raw file of the size, `mkfs.ext4` on it, converted to qcow2
  (holes kept), so the guest mounts it as it is (no partition table). Its inode
  tables are zeroed here (`lazy_itable_init=0`: `fallocate` zero ranges, no byte
  written; a 1 TiB volume's 16 GiB of them taken on the host until the raw file
  goes, 0.5 s), so the guest's kernel has none to zero in the background after the
  first mount (`ext4lazyinit`, writing to the volume while the first work on it
  runs); the qcow2 holds a few MiB as before.
- **grow**: `qemu-img resize` of the file while no VM holds it; the ext4 inside
  grows at its next writable mount, in the guest (`resize2fs` online).
- **clone** in constant time: the source's file becomes a frozen parent (hard
  links named at random under `parents/`, one per child, so a parent goes with
  its last child), and the source and the clone each get a new empty overlay on
  it. Writes of either never reach the other.
- **freeze** for a VM snapshot (SPEC §12, §18), while its domain is stopped: as a
  clone, the volume's file becomes a frozen parent and the volume gets a new
  overlay on it, and the snapshot keeps the frozen file as
  `parents/<snapshot id>.<volume id>.qcow2`; `clone_frozen` makes a new volume on
  it (constant time too), `thaw` drops the snapshot's names when it goes.
- **remove**: the file goes, and each frozen parent whose last child it was.

This machine's files only; a host elsewhere's: rift.guest.host_volumes, by SSH."""

from __future__ import annotations

import json
import os
import re
import secrets
import struct
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from hypervisor.base import HostDisk, ImageError, VolumeDisk, elsewhere
from hypervisor.commands import run_command
from hypervisor.host_disk import LOCAL_DISK

GIB = 1 << 30
PARENTS = "parents"
_VOLUME_ID = re.compile(r"vol_[a-z2-7]{8}")
_SNAPSHOT_ID = re.compile(r"snap_[a-z2-7]{8}")
VOLUME_TIMEOUT_S = 120
QCOW2_HEADER = 20  # magic, version, backing file offset (u64) and size (u32), big-endian
MAX_BACKING_NAME = 1023  # QEMU's own bound on a backing file name
MAX_CHAIN = 64  # a clone of a clone of ...: far more than any chain here


def disk_xml(disk: VolumeDisk) -> str:
    """The `<disk>` device of a volume: virtio, qcow2, its serial the volume id."""
    root = ET.Element("disk", type="file", device="disk")
    ET.SubElement(root, "driver", name="qemu", type="qcow2", discard="unmap")
    ET.SubElement(root, "source", file=disk.path)
    ET.SubElement(root, "target", dev=disk.target, bus="virtio")
    ET.SubElement(root, "serial").text = disk.serial
    if disk.read_only:
        ET.SubElement(root, "readonly")
    return ET.tostring(root, encoding="unicode")


_DISK = re.compile(r"<disk\s[^>]*>.*?</disk>", re.DOTALL)
_VOLUME_SERIAL = re.compile(r"<serial>vol_[a-z2-7]{8}</serial>")
_CHAIN_START = re.compile(r"<backingStore\b")
_CHAIN_END = "</backingStore>"
_CHAIN_EMPTY = re.compile(r"<backingStore\s*/>")


def without_volume_chains(xml: str) -> str:
    """`xml` (a saved state's) with the backing chain libvirt recorded for each volume
    disk left out, every other byte kept, so a restore (a snapshot's, a fork's) looks
    at its file again: a snapshot's freeze puts a volume's file on a frozen parent
    while the saved domain holds it, and libvirt restored the domain along the
    chain its XML named (`<backingStore/>`: none), reading the parent's blocks as
    zeros (seen on a real guest). A managed save's start (pause, sleep) looks again
    by itself: a clone under a paused reader reads back right without this."""
    out, last = [], 0
    for disk in _DISK.finditer(xml):
        body = disk.group(0)
        start = _CHAIN_START.search(body)
        if _VOLUME_SERIAL.search(body) is None or start is None:
            continue
        end = body.rfind(_CHAIN_END)
        if end >= start.start():
            cut = end + len(_CHAIN_END)
        else:
            empty = _CHAIN_EMPTY.match(body, start.start())
            if empty is None:
                continue
            cut = empty.end()
        out.append(xml[last:disk.start()])
        out.append(body[:start.start()] + body[cut:])
        last = disk.end()
    out.append(xml[last:])
    return "".join(out)


class VolumeFolder:
    """The volumes' files in one folder of this machine, for the hosts whose libvirt
    runs here (the engine's VolumeFiles port); ImageError for a host elsewhere."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def file(self, volume_id: str) -> Path:
        if not _VOLUME_ID.fullmatch(volume_id):
            raise ImageError(f"volume id {volume_id!r} cannot name a file")
        return self.folder / f"{volume_id}.qcow2"

    def path(self, uri: str, volume_id: str) -> str:
        _here(uri)
        return str(self.file(volume_id))

    def make(self, uri: str, volume_id: str, size_gib: int) -> None:
        target = Path(self.path(uri, volume_id))
        self.folder.mkdir(parents=True, exist_ok=True)
        raw = self.folder / f".{volume_id}.raw"
        partial = self.folder / f".{volume_id}.qcow2"
        try:
            with raw.open("wb") as f:
                f.truncate(size_gib * GIB)
            run_command(["mkfs.ext4", "-q", "-F", "-m", "0", "-E",
                         "lazy_itable_init=0,lazy_journal_init=1,nodiscard", str(raw)],
                        timeout_s=VOLUME_TIMEOUT_S)
            run_command(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw),
                         str(partial)], timeout_s=VOLUME_TIMEOUT_S)
            partial.replace(target)
        finally:
            raw.unlink(missing_ok=True)
            partial.unlink(missing_ok=True)

    def grow(self, uri: str, volume_id: str, size_gib: int) -> None:
        run_command(["qemu-img", "resize", "-q", self.path(uri, volume_id),
                     str(size_gib * GIB)], timeout_s=VOLUME_TIMEOUT_S)

    def clone(self, uri: str, source_id: str, volume_id: str) -> None:
        source, target = Path(self.path(uri, source_id)), self.file(volume_id)
        parents = self.folder / PARENTS
        parents.mkdir(parents=True, exist_ok=True)
        for_source = parents / f"{secrets.token_hex(8)}.qcow2"
        for_clone = parents / f"{secrets.token_hex(8)}.qcow2"
        os.link(source, for_source)
        os.link(source, for_clone)
        size = str(_virtual_size(source))
        fresh = self.folder / f".{source_id}.qcow2"
        _overlay(for_clone, target, size)
        _overlay(for_source, fresh, size)
        fresh.replace(source)  # the source's old name now only under parents/, frozen
        for parent in (for_source, for_clone):
            os.chmod(parent, 0o444)

    def freeze(self, uri: str, volume_id: str, snapshot_id: str) -> None:
        source = Path(self.path(uri, volume_id))
        parents = self.folder / PARENTS
        parents.mkdir(parents=True, exist_ok=True)
        kept = self._kept(snapshot_id, volume_id)
        for_source = parents / f"{secrets.token_hex(8)}.qcow2"
        os.link(source, kept)
        os.link(source, for_source)
        fresh = self.folder / f".{volume_id}.qcow2"
        _overlay(for_source, fresh, str(_virtual_size(source)))
        fresh.replace(source)
        for parent in (kept, for_source):
            os.chmod(parent, 0o444)

    def frozen(self, uri: str, snapshot_id: str) -> dict[str, int]:
        _here(uri)
        prefix = kept_prefix(snapshot_id)
        parents = self.folder / PARENTS
        kept = list(parents.glob(prefix + "*.qcow2")) if parents.is_dir() else []
        found = {p.name[len(prefix):-len(".qcow2")]: p for p in kept}
        return {v: -(-_header_size(p) // GIB) for v, p in sorted(found.items())
                if _VOLUME_ID.fullmatch(v)}

    def clone_frozen(self, uri: str, snapshot_id: str, source_id: str,
                     volume_id: str) -> None:
        self.path(uri, volume_id)
        kept, target = self._kept(snapshot_id, source_id), self.file(volume_id)
        for_clone = self.folder / PARENTS / f"{secrets.token_hex(8)}.qcow2"
        os.link(kept, for_clone)  # FileNotFoundError when the snapshot holds no such copy
        _overlay(for_clone, target, str(_virtual_size(kept)))

    def thaw(self, uri: str, snapshot_id: str) -> None:
        """The snapshot's frozen volumes go (each frozen file with its last name)."""
        _here(uri)
        parents = self.folder / PARENTS
        if parents.is_dir():
            for kept in parents.glob(f"{kept_prefix(snapshot_id)}*.qcow2"):
                _unlink_chain(kept, parents)

    def _kept(self, snapshot_id: str, volume_id: str) -> Path:
        self.file(volume_id)  # a volume id, or ImageError
        return self.folder / PARENTS / f"{kept_prefix(snapshot_id)}{volume_id}.qcow2"

    def remove(self, uri: str, volume_id: str) -> None:
        _unlink_chain(Path(self.path(uri, volume_id)), self.folder / PARENTS)

    def used_bytes(self, uri: str, volume_id: str) -> int | None:
        """The bytes its file and its frozen parents take here (their allocated blocks),
        read from the files themselves: no process is started. None without a file."""
        path: Path | None = Path(self.path(uri, volume_id))
        used, seen = 0, 0
        while path is not None and seen < MAX_CHAIN:
            try:
                used += path.stat().st_blocks * 512
            except FileNotFoundError:
                return None if seen == 0 else used
            path, seen = _backing_of(path), seen + 1
        return used


def _here(uri: str) -> None:
    if elsewhere(uri):
        raise ImageError(f"volumes live on hosts of this machine only, not {uri}")


def kept_prefix(snapshot_id: str) -> str:
    """How the names of a snapshot's kept volumes under `parents/` start."""
    if not _SNAPSHOT_ID.fullmatch(snapshot_id):
        raise ImageError(f"snapshot id {snapshot_id!r} cannot name a file")
    return f"{snapshot_id}."


def is_volume_id(text: str) -> bool:
    return _VOLUME_ID.fullmatch(text) is not None


def make_stand_in(volume_path: str, path: str, disk: HostDisk = LOCAL_DISK) -> None:
    """An empty qcow2 at `path` on `disk` (a host's files) the size of the volume at
    `volume_path` there: what a fork's domain holds in place of a volume it does not
    get (SPEC §18), until unplugged. Made here, written there (a splice of no byte)."""
    header = disk.read_at(volume_path, 0, QCOW2_HEADER + 12)
    if len(header) < QCOW2_HEADER + 12 or header[:4] != b"QFI\xfb":
        raise ImageError(f"{volume_path} is no qcow2 volume")
    with tempfile.TemporaryDirectory(prefix="rift-stand-in-") as folder:
        made = Path(folder) / "stand-in.qcow2"
        run_command(["qemu-img", "create", "-q", "-f", "qcow2", str(made),
                     str(struct.unpack(">Q", header[24:32])[0])], timeout_s=VOLUME_TIMEOUT_S)
        disk.spliced(volume_path, made.read_bytes(), disk.size(volume_path), path)


def _overlay(parent: Path, path: Path, size: str) -> None:
    run_command(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(parent),
                 str(path), size], timeout_s=VOLUME_TIMEOUT_S)


def _info(path: Path) -> dict[str, object]:
    out = run_command(["qemu-img", "info", "-U", "--output=json", str(path)],
                      timeout_s=VOLUME_TIMEOUT_S)
    info: dict[str, object] = json.loads(out)
    return info


def _virtual_size(path: Path) -> int:
    return int(str(_info(path)["virtual-size"]))


def _header_size(path: Path) -> int:
    """The virtual size a qcow2 header gives (bytes; 0 for a file that is none)."""
    with path.open("rb") as f:
        header = f.read(QCOW2_HEADER + 12)
    if len(header) < QCOW2_HEADER + 12 or header[:4] != b"QFI\xfb":
        return 0
    size: int = struct.unpack(">Q", header[24:32])[0]
    return size


def _backing_of(path: Path) -> Path | None:
    """The backing file a qcow2 header names (relative to the file's folder, as
    QEMU reads it), or None."""
    with path.open("rb") as f:
        header = f.read(QCOW2_HEADER)
        if len(header) < QCOW2_HEADER or header[:4] != b"QFI\xfb":
            return None
        offset, size = struct.unpack(">QI", header[8:20])
        if offset == 0 or not 0 < size <= MAX_BACKING_NAME:
            return None
        f.seek(offset)
        name = f.read(size).decode(errors="replace")
    return path.parent / name  # an absolute name stays itself


def _unlink_chain(path: Path, parents: Path) -> None:
    """Remove `path`; when it was the last name of its file, its parent's link too
    (and so on up the chain)."""
    while True:
        try:
            links = path.stat().st_nlink
        except FileNotFoundError:
            return
        backing = _info(path).get("backing-filename") if links == 1 else None
        path.unlink(missing_ok=True)
        if not isinstance(backing, str):
            return
        nxt = Path(backing)
        if nxt.parent != parents:
            return
        path = nxt
