"""Images made from snapshots (`rift image add NAME --snapshot SNAP_ID`): every VM
of such an image is a fork of one saved state, for every user.

The image's folder holds what a fork needs and nothing that belongs to the
snapshot's task any more:

- `state`: a copy of the snapshot's saved memory (libvirt's save file; each VM
  gets its own copy with its own XML, as forks do, see hypervisor.save_image);
- `disk.qcow2`: the snapshot's disk flattened into one standalone qcow2 (its
  backing chain read through, so a rebuild of the image it came from cannot
  break it), read-only; each VM gets an overlay of it of the same virtual size
  (the saved kernel knows that size). Images without a disk (`tiny`) have none;
- `key`: the SSH key the saved guest's root accepts (the snapshot's task's key,
  copied). Each VM keeps it as its boot key: the first login takes it, and the
  hand-over puts the VM's own key in its place before anyone else logs in;
- `manifest.json`: `kind: snapshot`, the sizes the state was saved at (vCPUs,
  memory, disk: fixed for every VM of the image), the guest's host key then
  (pinned for the first login; each VM makes its own after), the image the
  snapshot came from and its kind (`kernel` or `qcow2`: a qcow2 image's VMs get
  a cloud-init seed as their own vdb), and the sizes and sha256 of the files.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.commands import run_command
from hypervisor.disks import DISK_TIMEOUT_S
from hypervisor.manifest import sha256_file
from hypervisor.qcow2 import (
    DISK_FILE,
    MANIFEST,
    new_image_folder,
    qemu_img_info,
)

KIND_SNAPSHOT = "snapshot"
STATE_FILE = "state"
KEY_FILE = "key"


@dataclass(frozen=True)
class SnapshotSource:
    """What `add_snapshot_image` copies, and what it records of it."""

    snapshot_id: str
    image: str  # the image the snapshot's VM was made from
    origin_kind: str  # that image's kind: `kernel` or `qcow2`
    state: Path
    disk: Path | None
    key: Path
    host_key: str | None
    vcpus: int
    memory_mib: int
    disk_gib: int


@dataclass(frozen=True)
class SnapshotImage:
    """A registered snapshot image, as its manifest tells it."""

    name: str
    state: Path
    disk: Path | None
    disk_bytes: int  # the disk's virtual size (0 without a disk)
    key: Path
    host_key: str | None
    origin_kind: str
    vcpus: int
    memory_mib: int
    disk_gib: int


def add_snapshot_image(images_dir: Path, name: str, source: SnapshotSource, *,
                       flatten: bool = True) -> Path:
    """Make image `name` from a snapshot's files and answer its folder; ImageError
    (and nothing left behind) for a name that is reserved, malformed or taken, or
    files that cannot be copied (a full disk says so). With `flatten` False (a
    build's layer, SPEC §19) the disk is copied as it is: a copy-on-write overlay
    whose backing file (the image its VM started from) must stay."""
    with new_image_folder(images_dir, name) as work:
        state = work / STATE_FILE
        try:
            shutil.copyfile(source.state, state)
            shutil.copyfile(source.key, work / KEY_FILE)
        except OSError as exc:
            raise ImageError(f"could not copy the snapshot's files: {exc}") from exc
        state.chmod(0o444)
        (work / KEY_FILE).chmod(0o600)
        disk_facts: dict[str, object] | None = None
        if source.disk is not None:
            disk = work / DISK_FILE
            if flatten:  # the copy reads through its backing chain, and stands alone
                run_command(["qemu-img", "convert", "-q", "-O", "qcow2", str(source.disk),
                             str(disk)], timeout_s=DISK_TIMEOUT_S * 10)
            else:  # the overlay as it is, on the image its VM started from
                run_command(["cp", "--sparse=always", str(source.disk), str(disk)],
                            timeout_s=DISK_TIMEOUT_S * 10)
            disk.chmod(0o444)
            info = qemu_img_info(disk)
            disk_facts = {"file": DISK_FILE, "format": "qcow2",
                          "virtual_size": int(str(info["virtual-size"])),
                          "bytes": disk.stat().st_size, "sha256": sha256_file(disk),
                          "backing": info.get("full-backing-filename")}
        manifest = {
            "name": name,
            "kind": KIND_SNAPSHOT,
            "added_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": {"snapshot_id": source.snapshot_id, "image": source.image,
                       "kind": source.origin_kind},
            "vcpus": source.vcpus, "memory_mib": source.memory_mib,
            "disk_gib": source.disk_gib,
            "host_key": source.host_key,
            "state": {"file": STATE_FILE, "bytes": state.stat().st_size},
            "disk": disk_facts,
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return images_dir.resolve() / name


def snapshot_image(images_dir: Path, name: str) -> SnapshotImage:
    """The snapshot image `name`; ImageError when there is none (or it is not whole)."""
    folder = images_dir.resolve() / name
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("kind") != KIND_SNAPSHOT:
            raise ValueError(f"its kind is {manifest.get('kind')!r}")
        disk_facts = manifest.get("disk")
        image = SnapshotImage(
            name=name, state=folder / str(manifest["state"]["file"]),
            disk=None if not disk_facts else folder / str(disk_facts["file"]),
            disk_bytes=int(disk_facts["virtual_size"]) if disk_facts else 0,
            key=folder / KEY_FILE, host_key=manifest.get("host_key"),
            origin_kind=str(manifest["source"]["kind"]), vcpus=int(manifest["vcpus"]),
            memory_mib=int(manifest["memory_mib"]), disk_gib=int(manifest["disk_gib"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ImageError(f"image {name!r} is no snapshot image in {images_dir} ({exc}); "
                         f"`rift image add {name} --snapshot SNAP_ID` makes one") from exc
    for part in (image.state, image.key, image.disk):
        if part is not None and not part.is_file():
            raise ImageError(f"image {name!r} lacks {part.name}; `rift image remove {name}` "
                             "and add it again")
    return image


def fixed_sizes(images_dir: Path, name: str) -> tuple[int, int, int] | None:
    """(vCPUs, memory MiB, disk GiB) every VM of a snapshot image has; None for any
    other image (or none)."""
    try:
        manifest = json.loads((images_dir / name / MANIFEST).read_text())
        if manifest.get("kind") != KIND_SNAPSHOT:
            return None
        return int(manifest["vcpus"]), int(manifest["memory_mib"]), int(manifest["disk_gib"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
