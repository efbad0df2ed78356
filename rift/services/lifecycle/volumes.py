"""Volumes (SPEC §18): `rift_volume_new`, `_list`, `_get`, `_delete`, `_resize` and
`_clone` (of a volume, or of one a VM snapshot keeps: `volume_snapshots`). A volume
belongs to a user, not a task, and outlives tasks; its file is a sparse qcow2 with
ext4 inside on its host (`deps.volume_files`). Another user's volume is answered as
an unknown one (`volume_not_found`). Attaching one to a VM is `volume_attach`; a
VM's end detaches it (`volume_ends`).

A new volume's row is written `making` before its file is made and `ready` after;
a delete is `deleting` before its file goes, then the row goes. Volume bytes (its
whole size: it may fill) count against the user's disk budget (§15,
`disk_budget`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from hypervisor.base import ImageError, elsewhere
from rift.contract.volumes import (
    VolumeCloneIn,
    VolumeIdIn,
    VolumeListIn,
    VolumeListOut,
    VolumeNewIn,
    VolumeOut,
    VolumeResizeIn,
)
from rift.domain.errors import (
    HypervisorFailed,
    InvalidArgument,
    NoVolumeHost,
    VolumeBusy,
    VolumeNotFound,
)
from rift.domain.ids import new_volume_id
from rift.domain.store_errors import DuplicateKey
from rift.domain.volumes import MARK_KEY, Volume
from rift.services.context import Caller, Deps
from rift.services.lifecycle.disk_budget import check_volume_room
from rift.services.lifecycle.volume_snapshots import clone_source
from rift.services.ports import Tx
from rift.services.read import views


def owned_volume(tx: Tx, caller: Caller, volume_id: str, *, lock: bool = False) -> Volume:
    """The caller's volume `volume_id` (ready); another user's is `volume_not_found`."""
    found = tx.volumes.get(volume_id, lock=lock)
    if found is None or found.owner != caller.user or found.state != "ready":
        raise VolumeNotFound(volume_id)
    return found


def host_uri(tx: Tx, host: str) -> str:
    found = tx.hosts.get(host)
    if found is None:
        raise HypervisorFailed(f"host {host} of the volume is gone", host=host)
    return found.uri


def _volume_host(tx: Tx) -> str:
    """Where a new volume goes: the first host (by name) taking new VMs, this
    machine's before those elsewhere (its file is made on that host's machine, and
    the VMs that hold it are placed there)."""
    taking = [h for h in tx.hosts.all() if not h.drained and h.unreachable_since is None]
    if not taking:
        raise NoVolumeHost()
    return min(taking, key=lambda h: (elsewhere(h.uri), h.name)).name


def moved(tx: Tx) -> None:
    """Tell the Boxes pages a volume changed (a new token under MARK_KEY); a swap lost
    to another change moved the mark all the same."""
    tx.meta.swap(MARK_KEY, tx.meta.get(MARK_KEY), secrets.token_hex(6))


def _files(step: Callable[[], None]) -> None:
    try:
        step()
    except (OSError, ImageError) as exc:
        raise HypervisorFailed(f"the volume's file: {exc}") from exc


def _made(deps: Deps, row: Volume, make: Callable[[], None]) -> Volume:
    """The row `making` is there: make its file, then mark it ready (or drop the row)."""
    try:
        _files(make)
    except HypervisorFailed:
        with deps.store.write() as tx:
            tx.volumes.remove(row.removed())
        raise
    ready = row.made()
    with deps.store.write() as tx:
        tx.volumes.save(ready, row)
        moved(tx)
    return ready


def _add(tx: Tx, row: Volume) -> None:
    try:
        tx.volumes.add(row)
    except DuplicateKey as exc:
        raise InvalidArgument("name", f"you have a volume named {row.name!r} already "
                              "(rift_volume_list)") from exc


def new(deps: Deps, caller: Caller, cmd: VolumeNewIn) -> VolumeOut:
    """`rift_volume_new`: an empty ext4 volume of `size_gib` on a host."""
    now = deps.clock.now()
    with deps.store.write() as tx:
        check_volume_room(deps, tx, caller.user, cmd.size_gib)
        host = _volume_host(tx)
        uri = host_uri(tx, host)
        row = Volume(new_volume_id(), caller.user, cmd.name, cmd.size_gib, host, "making", now)
        _add(tx, row)
    made = _made(deps, row,
                 lambda: deps.volume_files.make(uri, row.id, cmd.size_gib))
    return VolumeOut(volume=views.volume(made))


def list_volumes(deps: Deps, caller: Caller, cmd: VolumeListIn) -> VolumeListOut:
    """`rift_volume_list`: the caller's volumes, oldest first."""
    with deps.store.read() as tx:
        rows = [v for v in tx.volumes.of_owner(caller.user) if v.state == "ready"]
        return VolumeListOut(volumes=[views.volume_now(tx, v) for v in rows])


def get(deps: Deps, caller: Caller, cmd: VolumeIdIn) -> VolumeOut:
    """`rift_volume_get`."""
    with deps.store.read() as tx:
        found = owned_volume(tx, caller, cmd.volume_id)
        return VolumeOut(volume=views.volume_now(tx, found))


def _check_unheld(tx: Tx, volume: Volume, doing: str, *, writers_only: bool = False) -> None:
    for held in tx.volumes.holders(volume.id):
        if not writers_only or not held.read_only:
            raise VolumeBusy(volume.id, held.vm_id, held.task_id, doing)


def delete(deps: Deps, caller: Caller, cmd: VolumeIdIn) -> VolumeOut:
    """`rift_volume_delete`: refused while attached (`volume_busy`)."""
    with deps.store.write() as tx:
        found = owned_volume(tx, caller, cmd.volume_id, lock=True)
        _check_unheld(tx, found, "it cannot be deleted while attached")
        gone = found.deleting()
        tx.volumes.save(gone, found)
        uri = host_uri(tx, found.host)
    _files(lambda: deps.volume_files.remove(uri, found.id))
    with deps.store.write() as tx:
        tx.volumes.remove(gone.removed())
        moved(tx)
    return VolumeOut(volume=views.volume(found))


def resize(deps: Deps, caller: Caller, cmd: VolumeResizeIn) -> VolumeOut:
    """`rift_volume_resize`: grow only, while no VM holds it."""
    with deps.store.write() as tx:
        found = owned_volume(tx, caller, cmd.volume_id, lock=True)
        grown = found.grown(cmd.size_gib)
        if grown.size_gib == found.size_gib:
            return VolumeOut(volume=views.volume(found))
        _check_unheld(tx, found, "it grows only while detached")
        check_volume_room(deps, tx, caller.user, grown.size_gib - found.size_gib)
        uri = host_uri(tx, found.host)
        # the file grows inside the transaction: the row locked, no attach meanwhile
        _files(lambda: deps.volume_files.grow(uri, found.id, grown.size_gib))
        tx.volumes.save(grown, found)
        moved(tx)
    return VolumeOut(volume=views.volume(grown))


def clone(deps: Deps, caller: Caller, cmd: VolumeCloneIn) -> VolumeOut:
    """`rift_volume_clone`: a copy-on-write child, on the source's host, while no VM
    writes the source (readers may hold it: they see the same bytes); with
    `snapshot_id`, of the source as that snapshot keeps it (`volume_snapshots`)."""
    if cmd.snapshot_id is not None:
        return _clone_kept(deps, caller, cmd, cmd.snapshot_id)
    now = deps.clock.now()
    with deps.store.write() as tx:
        source = owned_volume(tx, caller, cmd.volume_id, lock=True)
        _check_unheld(tx, source, "it is cloned only while no VM writes it", writers_only=True)
        check_volume_room(deps, tx, caller.user, source.size_gib)
        uri = host_uri(tx, source.host)
        row = Volume(new_volume_id(), caller.user, cmd.name, source.size_gib, source.host,
                     "making", now, parent_id=source.id)
        _add(tx, row)
    made = _made(deps, row,
                 lambda: deps.volume_files.clone(uri, source.id, row.id))
    return VolumeOut(volume=views.volume(made))


def _clone_kept(deps: Deps, caller: Caller, cmd: VolumeCloneIn, snapshot_id: str,
                ) -> VolumeOut:
    now = deps.clock.now()
    with deps.store.write() as tx:
        size_gib, host, uri = clone_source(deps, tx, caller, snapshot_id, cmd.volume_id)
        check_volume_room(deps, tx, caller.user, size_gib)
        row = Volume(new_volume_id(), caller.user, cmd.name, size_gib, host, "making", now,
                     parent_id=cmd.volume_id)
        _add(tx, row)
    made = _made(deps, row, lambda: deps.volume_files.clone_frozen(
        uri, snapshot_id, cmd.volume_id, row.id))
    return VolumeOut(volume=views.volume(made))
