"""The volumes' ports (SPEC §18), all called by the volume use cases: their rows
(``tx.volumes``), their files on a host (`VolumeFiles`) and their mounts in a
guest (`GuestMounts`). A control plane without real guests has the null objects
of rift.services.absent (no file is made, nothing is mounted)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hypervisor.volume_content import Entry, Meta
from rift.domain.model import Vm
from rift.domain.volumes import Attachment, Volume


class VolumeRepository(Protocol):
    """Volumes and their attachments. A volume's change is a domain transition
    (`Volume.made`, `grown`, `deleting`, `removed`) saved with one compare-and-set
    on the state it left; an attachment's likewise (`save_attachment`)."""

    def add(self, volume: Volume) -> None:
        """DuplicateKey("volumes", "name") when the owner has a volume of that name."""
        ...
    def get(self, volume_id: str, *, lock: bool = False) -> Volume | None: ...
    def of_owner(self, owner: str) -> list[Volume]:
        """Oldest first."""
        ...
    def on_host(self, host: str) -> list[Volume]:
        """Every volume whose file is on `host`, oldest first."""
        ...
    def gib_of_owner(self, owner: str) -> int:
        """The sizes of the user's volumes, summed."""
        ...
    def save(self, volume: Volume, was: Volume) -> bool: ...
    def record_used(self, volume_id: str, used_bytes: int) -> bool:
        """Set a ready volume's sampled `used_bytes`; False when it is not ready."""
        ...
    def remove(self, volume: Volume) -> bool:
        """Delete the row while it is still in ``volume.state``."""
        ...
    def attach(self, attachment: Attachment) -> None:
        """DuplicateKey when the volume is attached to that VM already."""
        ...
    def holders(self, volume_id: str) -> list[Attachment]: ...
    def of_vms(self, vm_ids: Sequence[str]) -> dict[str, list[Attachment]]:
        """Every asked VM id is a key (with ``[]`` when it has none), by guest disk."""
        ...
    def unsettled(self) -> list[Attachment]:
        """Attachments `attaching` or `detaching` (a change under way, or one a crash
        cut), oldest first."""
        ...
    def save_attachment(self, attachment: Attachment, was: Attachment) -> bool: ...
    def detach(self, vm_id: str, volume_id: str | None = None) -> list[Attachment]:
        """Delete the VM's attachment of `volume_id` (every one when None); answers them."""
        ...


class VolumeFiles(Protocol):
    """The volumes' files on the host at `uri` ("": this machine): each a sparse
    qcow2 with ext4 inside (hypervisor.volumes here, rift.guest.host_volumes on a
    host elsewhere, through its SSH). OSError or ImageError when the host refuses."""

    def path(self, uri: str, volume_id: str) -> str:
        """Where the volume's file is on its host (what a domain's disk names)."""
        ...
    def make(self, uri: str, volume_id: str, size_gib: int) -> None: ...
    def grow(self, uri: str, volume_id: str, size_gib: int) -> None: ...
    def clone(self, uri: str, source_id: str, volume_id: str) -> None:
        """A copy-on-write child of the source, in constant time; both stay writable."""
        ...
    def remove(self, uri: str, volume_id: str) -> None:
        """Its file goes (and the frozen parents no other volume needs); absent is fine."""
        ...
    def freeze(self, uri: str, volume_id: str, snapshot_id: str) -> None:
        """Keep the volume as it is now for a VM snapshot, in constant time, while no
        QEMU has it open for writing; the volume goes on writable."""
        ...
    def frozen(self, uri: str, snapshot_id: str) -> dict[str, int]:
        """The volumes the snapshot keeps: id, size in GiB (as it was then)."""
        ...
    def clone_frozen(self, uri: str, snapshot_id: str, source_id: str,
                     volume_id: str) -> None:
        """A new volume holding what the snapshot kept of `source_id`, in constant time."""
        ...
    def thaw(self, uri: str, snapshot_id: str) -> None:
        """The snapshot's kept volumes go (its files are removed); none is fine."""
        ...
    def used_bytes(self, uri: str, volume_id: str) -> int | None:
        """What its file and the frozen parents it reads take on the host (None: no
        file, or one this machine does not reach)."""
        ...
    def send(self, uri: str, dest_uri: str, volume_id: str, whole: bool) -> None:
        """Put the volume on the host at `dest_uri` too, at the same path, for a VM
        moving there with it: its frozen parents, then its file (a whole copy when
        `whole`: nobody writes it; else an empty overlay the migration fills).
        Nothing for two hosts of this machine (they share the file)."""
        ...


class GuestMounts(Protocol):
    """Mounting a hot-plugged volume in a running guest (GuestUnreachable when the
    guest does not answer, InvalidArgument naming `path` when it refuses)."""

    def mount(self, vm: Vm, serial: str, path: str, read_only: bool) -> None:
        """Wait for the disk whose serial is `serial`, mount it (ext4) at `path`
        (made when missing) and grow its file system to the disk when writable."""
        ...
    def unmount(self, vm: Vm, path: str) -> None:
        """Write out what is cached and unmount `path` (not mounted: nothing)."""
        ...
    def flush(self, vm: Vm, paths: list[str]) -> None:
        """Write out what the guest caches and the journal of each file system mounted
        at `paths` (its volumes written), before a snapshot keeps them."""
        ...


class VolumeContent(Protocol):
    """A detached volume's files on its host, with no guest (E2B's volume content
    API): hypervisor.volume_content. `volume_file` is `VolumeFiles.path`'s. Raises
    FileNotFoundError, FileExistsError, NotADirectoryError or IsADirectoryError for
    a path of the wrong kind, OSError or ImageError when the host cannot."""

    def list(self, uri: str, volume_file: str, path: str, depth: int) -> list[Entry]: ...
    def stat(self, uri: str, volume_file: str, path: str) -> Entry: ...
    def read(self, uri: str, volume_file: str, path: str) -> bytes: ...
    def write(self, uri: str, volume_file: str, path: str, data: bytes, meta: Meta,
              ) -> Entry: ...
    def make_dir(self, uri: str, volume_file: str, path: str, meta: Meta) -> Entry: ...
    def set_meta(self, uri: str, volume_file: str, path: str, meta: Meta) -> Entry: ...
    def remove(self, uri: str, volume_file: str, path: str) -> None: ...
