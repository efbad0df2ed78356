"""A snapshot's files (SPEC §12): they live on its VM's host, in `snapshots/<id>/`
(`state`, and `disk.qcow2` for images with a disk), and the volumes it keeps;
where they are, removing them, and the folders and forks' copies a crash left that
no row names.
"""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.host_disk import LOCAL_DISK, HostDisk
from hypervisor.save_image import FORK_PREFIX
from rift.services.context import Deps

STATE_FILE = "state"
DISK_FILE = "disk.qcow2"


def snapshot_dir(deps: Deps, snapshot_id: str) -> Path | None:
    """Where the snapshot's files are; None without a guest runtime (engine tests)."""
    return deps.runtime.snapshot_folder(snapshot_id)


def state_path(deps: Deps, snapshot_id: str) -> str:
    folder = snapshot_dir(deps, snapshot_id)
    return str(folder / STATE_FILE) if folder is not None else f"memory:{snapshot_id}"


def host_disk(deps: Deps, host_name: str) -> HostDisk:
    """The files of the host a snapshot is on (its VM's): they are kept there."""
    with deps.store.read() as tx:
        host = tx.hosts.get(host_name)
    return deps.hosts.hypervisor(host.uri).disk if host is not None else LOCAL_DISK


def remove_files(deps: Deps, snapshot_id: str, disk: HostDisk) -> None:
    """Its folder and the volumes it keeps (rift.services.lifecycle.volume_snapshots)."""
    folder = snapshot_dir(deps, snapshot_id)
    if folder is not None:
        try:
            disk.remove(str(folder))
        except OSError as exc:  # a host that does not answer: its files stay there
            deps.log.warning("a snapshot's files could not be removed", extra={
                "snapshot_id": snapshot_id, "error": str(exc)})
    with deps.store.read() as tx:  # its volumes' copies are on its host (this machine's: "")
        snap = tx.snapshots.get(snapshot_id)
        host = tx.hosts.get(snap.host) if snap is not None else None
    try:
        deps.volume_files.thaw(host.uri if host is not None else "", snapshot_id)
    except (OSError, ImageError) as exc:
        deps.log.warning("the volumes a snapshot kept could not be removed", extra={
            "snapshot_id": snapshot_id, "error": str(exc)})


def dead_snapshot_files(deps: Deps) -> list[str]:
    """Folders under `snapshots/` that no row names (a crash between the folder and
    the row, or a row purged), and forks' copies of a saved state (in a snapshot's
    folder or a snapshot image's) that a crash left behind, older than the grace
    a start has: they go. Answers the snapshot ids and file names removed."""
    kept = deps.runtime.kept_folders()  # (snapshots, images); none without real guests
    if not kept:
        return []
    gone: list[str] = []
    snapshots_dir = kept[0]
    found = [p.name for p in snapshots_dir.iterdir() if p.is_dir()] if snapshots_dir.is_dir() \
        else []
    with deps.store.read() as tx:
        dead = [name for name in found if tx.snapshots.get(name) is None]
    for name in dead:
        remove_files(deps, name, LOCAL_DISK)
        gone.append(name)
    cutoff = time.time() - deps.limits.creating_grace_s  # files: the wall clock
    for folder in kept:
        for copy in folder.glob(f"*/{FORK_PREFIX}*"):
            with suppress(OSError):
                if copy.stat().st_mtime < cutoff:
                    copy.unlink()
                    gone.append(copy.name)
    return gone
