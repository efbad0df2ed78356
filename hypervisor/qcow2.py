"""Operator-registered qcow2 images, and the per-VM disks that boot them.

`add_qcow2` checks that a file is a standalone qcow2 (`qemu-img info`), copies
it (a reflink where the filesystem can) to `<images dir>/<name>/disk.qcow2`,
read-only, and writes `manifest.json` beside it: `kind: qcow2`, the virtual
size, the sha256 and when it was added. The image must boot from its own disk
(a boot loader on it), run cloud-init with the NoCloud data source, let root in
by key and serve SSH on port 22 of its first NIC, which gets its address by
DHCP (QEMU's user-mode network). `scripts/debian-image.sh` makes such an image
from Debian packages.

Per VM (`prepare_vm_disks`): a copy-on-write overlay backed by the image and a
NoCloud seed with the task's key (hypervisor.disks).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hypervisor.base import DomainSpec, GuestDomain, ImageError
from hypervisor.commands import run_command
from hypervisor.disks import (
    DISK_TIMEOUT_S,
    VmDisks,
    make_overlay,
    make_seed,
    remove_vm_disks,
    seed_files,
    vm_disks,
)
from hypervisor.manifest import sha256_file

KIND_KERNEL = "kernel"  # `tiny` and images like it: kernel + initramfs, booted directly
KIND_QCOW2 = "qcow2"
DISK_FILE = "disk.qcow2"
MANIFEST = "manifest.json"
RESERVED = ("tiny", "debian")  # built by `rift image build`, never added or removed by hand
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")  # as rift.catalog lists them
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Qcow2Image:
    """A registered qcow2 image: the read-only base every VM's overlay points at."""

    name: str
    disk: Path
    virtual_size: int


def image_kind(images_dir: Path, name: str) -> str | None:
    """`qcow2` or `kernel` from the image's manifest; None when it has no readable one."""
    try:
        manifest = json.loads((images_dir / name / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    return str(manifest.get("kind", KIND_KERNEL))


def qcow2_image(images_dir: Path, name: str) -> Qcow2Image:
    """The registered qcow2 image `name`; ImageError when there is none."""
    folder = images_dir / name
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("kind") != KIND_QCOW2:
            raise ValueError(f"its kind is {manifest.get('kind', KIND_KERNEL)!r}")
        disk = folder / str(manifest["disk"]["file"])
        size = int(manifest["disk"]["virtual_size"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ImageError(f"image {name!r} is no qcow2 image in {images_dir} ({exc}); "
                         f"`rift image add {name} FILE.qcow2` registers one") from exc
    if not disk.is_file():
        raise ImageError(f"image {name!r} lacks {disk}; `rift image remove {name}` and "
                         "`rift image add` again")
    return Qcow2Image(name=name, disk=disk.resolve(), virtual_size=size)


def check_new_name(images_dir: Path, name: str) -> Path:
    """The folder a new image `name` would take; ImageError for a name that is
    reserved, malformed or taken."""
    if name in RESERVED:
        raise ImageError(f"{name!r} is built by Rift (`rift image build {name}`); "
                         "choose another name")
    if not _NAME.fullmatch(name):
        raise ImageError(f"image name {name!r} must match [a-z0-9][a-z0-9_.-]* "
                         "(at most 64 characters)")
    target = images_dir.resolve() / name
    if target.exists() or target.is_symlink():
        raise ImageError(f"image {name!r} exists already; `rift image remove {name}` first")
    return target


@contextmanager
def new_image_folder(images_dir: Path, name: str) -> Iterator[Path]:
    """A work folder for image `name` that becomes `<images dir>/<name>` when the
    block ends well (atomically: the image appears whole or not at all) and goes
    when it does not."""
    target = check_new_name(images_dir, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".add-{name}-", dir=target.parent))
    try:
        yield work
        work.chmod(0o755)
        try:
            work.rename(target)  # atomic; fails when a racing add took the name
        except OSError as exc:
            raise ImageError(f"image {name!r} exists already") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def add_qcow2(images_dir: Path, name: str, source: Path) -> Path:
    """Register `source` as image `name` and answer its folder.

    Refuses (ImageError) a name that is reserved, malformed or taken, and a file
    that is not qcow2 or has a backing file. The folder appears whole or not at all.
    """
    check_new_name(images_dir, name)
    if not source.is_file():
        raise ImageError(f"{source} is not a file")
    _standalone_qcow2(source)  # refuse early, before copying anything
    with new_image_folder(images_dir, name) as work:
        disk = work / DISK_FILE
        _run(["cp", "--reflink=auto", "--sparse=always", str(source), str(disk)])
        disk.chmod(0o444)
        virtual_size = _standalone_qcow2(disk)  # what is kept, not what was looked at
        manifest = {
            "name": name,
            "kind": KIND_QCOW2,
            "added_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": str(source.resolve()),
            "disk": {"file": DISK_FILE, "format": KIND_QCOW2,
                     "virtual_size": virtual_size,
                     "bytes": disk.stat().st_size, "sha256": sha256_file(disk)},
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return images_dir.resolve() / name


def remove_image(images_dir: Path, name: str) -> None:
    """Delete image `name`'s folder (out of the catalog at once, then from the disk).
    Whether a VM still uses it is the caller's question."""
    if name in RESERVED:
        raise ImageError(f"{name!r} is Rift's own image; it is not removed")
    if not _NAME.fullmatch(name):
        raise ImageError(f"no image {name!r}")
    folder = images_dir / name
    if not folder.exists() and not folder.is_symlink():
        raise ImageError(f"no image {name!r} in {images_dir}")
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink()
        return
    doomed = Path(tempfile.mkdtemp(prefix=f".remove-{name}-", dir=images_dir))
    folder.rename(doomed / name)
    shutil.rmtree(doomed, ignore_errors=True)


def _standalone_qcow2(path: Path) -> int:
    """The virtual size of a qcow2 file with no backing file; ImageError otherwise."""
    info = qemu_img_info(path)
    if info.get("format") != KIND_QCOW2:
        raise ImageError(f"{path} is {info.get('format', 'not an image')}, not qcow2 "
                         "(`qemu-img convert -O qcow2` makes one)")
    if info.get("backing-filename"):
        raise ImageError(f"{path} has a backing file ({info['backing-filename']}); "
                         "`qemu-img convert -O qcow2` flattens it")
    virtual_size = info.get("virtual-size")
    if not isinstance(virtual_size, int) or virtual_size <= 0:
        raise ImageError(f"qemu-img info gives {path} no virtual size")
    return virtual_size


def qemu_img_info(path: Path) -> dict[str, object]:
    """`qemu-img info --output=json` of a file; ImageError when it is no image at all."""
    out = _run(["qemu-img", "info", "--output=json", str(path)])
    try:
        info = json.loads(out)
    except ValueError as exc:
        raise ImageError(f"qemu-img info said something unreadable about {path}") from exc
    if not isinstance(info, dict):
        raise ImageError(f"qemu-img info said something unreadable about {path}")
    return info


# per VM


def prepare_vm_disks(image: Qcow2Image, disks_dir: Path, *, vm_id: str,
                     public_key_line: str, size_bytes: int | None = None) -> VmDisks:
    """Make the VM's overlay on `image` (of `size_bytes`, never less than the image's
    virtual size; default that size) and its seed; ImageError (and nothing left
    behind) when either cannot be made."""
    disks = vm_disks(disks_dir.resolve(), vm_id)
    disks_dir.mkdir(parents=True, exist_ok=True)
    try:
        make_overlay(image.disk, disks.overlay,
                     None if size_bytes is None else max(size_bytes, image.virtual_size))
        make_seed(disks.seed, seed_files(vm_id, public_key_line))
    except ImageError:
        remove_vm_disks(disks_dir, vm_id)
        raise
    return disks


def qcow2_guest_spec(image: Qcow2Image, disks: VmDisks, domain: GuestDomain) -> DomainSpec:
    """The DomainSpec that boots the VM's overlay of `image`, seed attached, with SSH
    on 127.0.0.1:`domain.ssh_port`."""
    return DomainSpec(
        name=domain.name, task_id=domain.task_id, vm_id=domain.vm_id, vcpus=domain.vcpus,
        memory_mib=domain.memory_mib, image=image.name, domain_type=domain.domain_type,
        ssh_port=domain.ssh_port, serial_log=str(domain.serial_log), disk=str(disks.overlay),
        seed=str(disks.seed),
    )


def _run(argv: list[str], *, cwd: Path | None = None) -> str:
    return run_command(argv, cwd=cwd, timeout_s=DISK_TIMEOUT_S)


