"""Volumes kept by VM snapshots (SPEC §12, §18): a snapshot of a VM that holds
volumes keeps each as it was, and `rift_volume_clone` with `snapshot_id` makes a
new volume of one of them, whether or not the volume still exists.

- **Kept** while the snapshot's save has the domain stopped (no QEMU writes the
  volume then; one held read-only elsewhere is written by none): the volume's
  file becomes a frozen parent, the volume goes on writable on a new overlay, and
  the snapshot keeps the frozen file (`VolumeFiles.freeze`, constant time; the VM
  restored from the save opens the overlay). The guest writes out what it caches
  first, and each written volume's journal (`sync`, then `fsfreeze` and thaw:
  `flush_held`), so a copy mounted read-only (`noload`) has it all; what a process
  writes between that and the save is in the snapshot's memory, not in the kept
  copy, which is as a power cut would leave it (ext4 replays its journal at a
  writable mount).
- **Listed** in the snapshot's view (`volumes`: each with the path it was held
  at, read-only or not, its size then, and whether a fork attaches it), from the
  `snapshot_made` event's `volumes`, which records them (rift.domain.volumes.KeptVolume).
- **Cloned** (`clone_source`): the snapshot must be the caller's and ready, and
  keep that volume; the clone has the kept size and lives on the snapshot's host.
- **Gone** with the snapshot's files (`snapshot_files.remove_files`: `thaw`); a
  clone made from it stays (its frozen parent goes with its last child).
"""

from __future__ import annotations

from hypervisor.base import ImageError
from rift.domain.errors import InvalidArgument, RiftError, SnapshotNotFound
from rift.domain.model import Vm
from rift.domain.volumes import KeptVolume
from rift.services.context import Caller, Deps
from rift.services.ports import Tx


def flush_held(deps: Deps, vm: Vm) -> None:
    """Before the save: the guest writes out what it caches when the VM holds volumes,
    so the kept copies have it (best effort: a guest that does not answer is logged,
    its copies as a power cut leaves them)."""
    with deps.store.read() as tx:
        held = tx.volumes.of_vms([vm.id])[vm.id]
    if not held:
        return
    try:
        deps.mounts.flush(vm, [att.path for att in held if not att.read_only])
    except RiftError as exc:
        deps.log.warning("the guest did not write out its volumes before a snapshot", extra={
            "vm_id": vm.id, "error": exc.message})


def freeze_held(deps: Deps, vm: Vm, snapshot_id: str, uri: str) -> list[KeptVolume]:
    """Keep, for the snapshot, every volume the stopped VM holds; answers them as
    kept (the snapshot's view lists them). OSError or ImageError when the host
    refuses (the snapshot is not made)."""
    with deps.store.read() as tx:
        held = tx.volumes.of_vms([vm.id])[vm.id]
        sizes = {att.volume_id: row.size_gib for att in held
                 if (row := tx.volumes.get(att.volume_id)) is not None}
    for att in held:
        deps.volume_files.freeze(uri, att.volume_id, snapshot_id)
    return [KeptVolume(att.volume_id, att.path, att.read_only, sizes.get(att.volume_id, 0))
            for att in held]


def clone_source(deps: Deps, tx: Tx, caller: Caller, snapshot_id: str,
                 volume_id: str) -> tuple[int, str, str]:
    """(size GiB, host, its URI) of `volume_id` as the caller's snapshot keeps it;
    `snapshot_not_found` for a snapshot not the caller's or not ready,
    `invalid_argument` for one that keeps no such volume."""
    snap = tx.snapshots.get(snapshot_id)
    if snap is None or snap.owner != caller.user or snap.state != "ready":
        raise SnapshotNotFound(snapshot_id)
    host = tx.hosts.get(snap.host)
    if host is None:
        raise SnapshotNotFound(snapshot_id)
    try:
        kept = deps.volume_files.frozen(host.uri, snapshot_id)
    except (OSError, ImageError) as exc:
        raise InvalidArgument("snapshot_id", f"the volumes {snapshot_id} keeps cannot be "
                              f"read on host {snap.host}: {exc}") from exc
    if volume_id not in kept:
        held = ", ".join(kept) or "none"
        raise InvalidArgument("volume_id", f"snapshot {snapshot_id} keeps no copy of "
                              f"{volume_id} (it keeps the volumes its VM held when it was "
                              f"taken: {held})")
    return kept[volume_id], snap.host, host.uri
