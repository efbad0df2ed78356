"""Volumes (SPEC §18): a user's disk that outlives tasks, and its attachments to VMs.

A volume belongs to a user (not a task), has a name unique per user, a size in
GiB (a sparse qcow2 on its host with ext4 inside) and a host. It changes only by
its methods, each answering the volume as it is after the change and refusing a
state the change does not start from (`IllegalTransition`); the store saves the
answer with one compare-and-set on the state it was read in
(``tx.volumes.save(new, was)``)::

    from       method              to          note
    (none)     -                   making      its row first, then its file
    making     made()              ready       its file is there
    ready      grown(size_gib)     ready       grow only (shrinking is refused)
    ready      deleting()          deleting    refused while attached (volume_busy)
    ready      moved(host)         ready       its VMs moved to another host of the
                                               machine its file is on (drain --move)
    making     removed()           (row goes)  its file could not be made
    deleting   removed()           (row goes)  its file is gone

An attachment is a volume plugged into one VM and mounted at `path` in its guest:
``attaching`` (recorded before libvirt is asked) → ``attached`` → ``detaching`` →
(row goes); a detach that fails is ``kept`` (``detaching`` → ``attached``). One VM
may write a volume at a time; many may read one nobody writes
(`check_attachable`). A VM's attachments end with it (detached, never deleted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from rift.domain.errors import InvalidArgument, VolumeBusy, check_from

VolumeState = Literal["making", "ready", "deleting"]
AttachmentState = Literal["attaching", "attached", "detaching"]
# The meta key each change of a volume sets (a new token): part of the Boxes page's
# change mark, as volumes belong to no task and append no task event.
MARK_KEY = "volumes_changed"
MAX_VOLUME_GIB = 1024  # sparse: the bound only keeps a guest from being promised a host's disk
# Where a volume may not be mounted: the guest's own system (SPEC §18).
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev", "/boot", "/usr", "/etc")
# The guest's virtio disks a volume may take: vda and vdb are the VM's own (its
# overlay, a cloud-init seed).
TARGETS = tuple(f"vd{letter}" for letter in "cdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class Volume:
    id: str
    owner: str
    name: str
    size_gib: int
    host: str
    state: VolumeState
    created_at: datetime
    parent_id: str | None = None  # the volume it was cloned from
    # What its file and the frozen parents it reads take on its host, as last sampled
    # (None before the first sample, or on a host whose files are not reached).
    used_bytes: int | None = None

    def made(self) -> Volume:
        check_from("volume", self.id, self.state, ("making",), "made")
        return replace(self, state="ready")

    def grown(self, size_gib: int) -> Volume:
        """The volume at `size_gib`: InvalidArgument for a shrink (never done)."""
        check_from("volume", self.id, self.state, ("ready",), "grown")
        if size_gib < self.size_gib:
            raise InvalidArgument("size_gib", f"a volume only grows: {self.id} is "
                                  f"{self.size_gib} GiB, more than {size_gib}")
        return replace(self, size_gib=size_gib)

    def moved(self, host: str) -> Volume:
        check_from("volume", self.id, self.state, ("ready",), "moved")
        return replace(self, host=host)

    def deleting(self) -> Volume:
        check_from("volume", self.id, self.state, ("ready",), "deleted")
        return replace(self, state="deleting")

    def removed(self) -> Volume:
        check_from("volume", self.id, self.state, ("making", "deleting"), "removed")
        return self


@dataclass(frozen=True)
class Attachment:
    volume_id: str
    vm_id: str
    task_id: str
    path: str
    read_only: bool
    target: str  # the guest's disk name (vdc, vdd, ...)
    state: AttachmentState
    created_at: datetime

    def attached(self) -> Attachment:
        check_from("attachment", self.volume_id, self.state, ("attaching",), "attached")
        return replace(self, state="attached")

    def detaching(self) -> Attachment:
        check_from("attachment", self.volume_id, self.state, ("attached",), "detaching")
        return replace(self, state="detaching")

    def kept(self) -> Attachment:
        """A detach that failed (the guest would not unmount, libvirt refused): attached."""
        check_from("attachment", self.volume_id, self.state, ("detaching",), "kept")
        return replace(self, state="attached")


@dataclass(frozen=True)
class KeptVolume:
    """A volume as a VM snapshot keeps it (SPEC §12, §18): held by the VM at `path`,
    read-only or not, `size_gib` then. A fork of the snapshot (a restore of it
    into another task alike) attaches it, read-only at `path`, only when the VM
    held it read-only; `rift_volume_clone` with the snapshot's id makes a volume
    of any of them. Kept in the snapshot's `snapshot_made` event (`volumes`)."""

    volume_id: str
    path: str
    read_only: bool
    size_gib: int

    @property
    def forks_attach(self) -> bool:
        return self.read_only

    def detail(self) -> dict[str, object]:
        return {"volume_id": self.volume_id, "path": self.path,
                "read_only": self.read_only, "size_gib": self.size_gib}

    @staticmethod
    def listed(details: dict[str, object]) -> list[KeptVolume]:
        """The volumes a `snapshot_made` event's details list (an entry of another
        shape, as the bare ids of older events, is left out)."""
        found = details.get("volumes")
        kept = []
        for item in found if isinstance(found, list) else []:
            if isinstance(item, dict) and isinstance(item.get("volume_id"), str) \
                    and isinstance(item.get("path"), str) \
                    and isinstance(item.get("read_only"), bool) \
                    and isinstance(item.get("size_gib"), int):
                kept.append(KeptVolume(item["volume_id"], item["path"], item["read_only"],
                                       item["size_gib"]))
        return kept


def mount_path(path: str) -> str:
    """`path` normalized, or InvalidArgument: absolute, not `/`, not under the guest's
    system folders (FORBIDDEN_ROOTS), no `..`."""
    if not path.startswith("/"):
        raise InvalidArgument("path", "must be absolute (start with /)")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument("path", "must not contain ..")
    if not parts:
        raise InvalidArgument("path", "must not be / (the guest's root)")
    normal = "/" + "/".join(parts)
    for root in FORBIDDEN_ROOTS:
        if normal == root or normal.startswith(root + "/"):
            raise InvalidArgument("path", f"must not be under {root} (the guest's own system)")
    if any(not (ch.isalnum() or ch in "/._-+@=,:") for ch in normal):
        raise InvalidArgument("path", "letters, digits and / . _ - + @ = , : only")
    return normal


def check_attachable(volume: Volume, holders: list[Attachment], read_only: bool) -> None:
    """VolumeBusy unless `volume` may be attached (`read_only` or not) beside the
    attachments it has: one writer, or many readers and no writer."""
    for held in holders:
        if not read_only or not held.read_only:
            doing = ("it has a writer" if not held.read_only
                     else "a writer needs it attached nowhere else")
            raise VolumeBusy(volume.id, held.vm_id, held.task_id, doing)


def free_target(taken: list[str]) -> str:
    """The first guest disk name a new attachment of a VM may take."""
    for target in TARGETS:
        if target not in taken:
            return target
    raise InvalidArgument("volume_id", f"a VM takes at most {len(TARGETS)} volumes")


class PathMissing(InvalidArgument):
    """A path not on the volume (its content API): `invalid_argument`, answered 404
    at the E2B door."""

    status = 404

    def __init__(self, volume_id: str, path: str) -> None:
        super().__init__("path", f"{path} is not on volume {volume_id}")


class PathTaken(InvalidArgument):
    """A path on the volume that is there and may not be (or not a folder where one
    is needed): `invalid_argument`, answered 409 at the E2B door."""

    status = 409

    def __init__(self, volume_id: str, path: str, why: str) -> None:
        super().__init__("path", f"{path} on volume {volume_id}: {why}")
