"""A detached volume's files without a VM (SPEC §16, §18): E2B's volume content API
(list a folder, stat, read, write, make a folder, change mode and owner, remove),
on the volume's host through the VolumeContent port (hypervisor.volume_content).

Only a volume no VM holds: an attached one is its VM's guest's to read and write
(`volume_busy` naming the VM, its task and `rift_vm_detach_volume`; the VM's own
files tools reach it meanwhile). The check is made in a read; a VM that attaches
it in between finds the file locked by QEMU and its attach is undone, and a call
here once a VM holds it cannot open it (`hypervisor_error`). A path not there is
`PathMissing`, one there that may not be `PathTaken` (both `invalid_argument`); a
file over MAX_CONTENT (16 MiB) is not read or written here (`invalid_argument`:
mount the volume in a VM for those). Blocking: the doors run these in worker
threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from hypervisor.base import ImageError
from hypervisor.volume_content import Entry, Meta, clean_path
from rift.contract.base import MAX_CONTENT
from rift.domain.errors import HypervisorFailed, InvalidArgument, VolumeBusy
from rift.domain.volumes import PathMissing, PathTaken
from rift.services.context import Caller, Deps
from rift.services.lifecycle.volumes import host_uri, owned_volume

T = TypeVar("T")
MAX_MODE = 0o7777
MAX_ID = 2**32 - 2


@dataclass(frozen=True)
class Spot:
    """A path on one of the caller's volumes, as a call names it."""

    volume_id: str
    path: str


def _detached(deps: Deps, caller: Caller, spot: Spot) -> tuple[str, str, str]:
    """(its host's URI, its file there, the path made normal) for the caller's volume
    that no VM holds."""
    with deps.store.read() as tx:
        volume = owned_volume(tx, caller, spot.volume_id)
        for held in tx.volumes.holders(volume.id):
            raise VolumeBusy(volume.id, held.vm_id, held.task_id,
                             "its files are its VM's while attached (the VM's files tools "
                             "read them there)")
        uri = host_uri(tx, volume.host)
    try:
        path = clean_path(spot.path)
    except ValueError as exc:
        raise InvalidArgument("path", str(exc)) from exc
    return uri, deps.volume_files.path(uri, volume.id), path


def meta_of(uid: int | None, gid: int | None, mode: int | None, *, force: bool = False,
            ) -> Meta:
    for name, value, top in (("uid", uid, MAX_ID), ("gid", gid, MAX_ID), ("mode", mode, MAX_MODE)):
        if value is not None and not 0 <= value <= top:
            raise InvalidArgument(name, f"from 0 to {top}")
    return Meta(uid, gid, mode, force)


def _on(spot: Spot, step: Callable[[], T]) -> T:
    """`step`'s answer, its failures as refusals."""
    try:
        return step()
    except FileNotFoundError as exc:
        raise PathMissing(spot.volume_id, str(exc) or spot.path) from exc
    except FileExistsError as exc:
        raise PathTaken(spot.volume_id, spot.path, "it is there already") from exc
    except NotADirectoryError as exc:
        raise PathTaken(spot.volume_id, str(exc) or spot.path, "not a folder") from exc
    except IsADirectoryError as exc:
        raise PathTaken(spot.volume_id, spot.path, "a folder") from exc
    except (OSError, ImageError) as exc:
        raise HypervisorFailed(f"volume {spot.volume_id}'s files: {exc}") from exc


def listing(deps: Deps, caller: Caller, spot: Spot, depth: int) -> list[Entry]:
    """The folder's entries, `depth` levels down (1: its own), parents first."""
    uri, file, path = _detached(deps, caller, spot)
    return _on(spot, lambda: deps.volume_content.list(uri, file, path, max(1, depth)))


def stat(deps: Deps, caller: Caller, spot: Spot) -> Entry:
    uri, file, path = _detached(deps, caller, spot)
    return _on(spot, lambda: deps.volume_content.stat(uri, file, path))


def read(deps: Deps, caller: Caller, spot: Spot) -> bytes:
    uri, file, path = _detached(deps, caller, spot)
    found = _on(spot, lambda: deps.volume_content.stat(uri, file, path))
    if found.size > MAX_CONTENT:
        raise InvalidArgument("path", f"{path} holds {found.size} bytes, more than the "
                              f"{MAX_CONTENT} read without a VM: mount the volume in one")
    return _on(spot, lambda: deps.volume_content.read(uri, file, path))


def write(deps: Deps, caller: Caller, spot: Spot, data: bytes, meta: Meta) -> Entry:
    """Write the file (made, or with `force` overwritten); its folder must be there."""
    if len(data) > MAX_CONTENT:
        raise InvalidArgument("body", f"at most {MAX_CONTENT} bytes written without a VM")
    uri, file, path = _detached(deps, caller, spot)
    if path == "/":
        raise PathTaken(spot.volume_id, path, "the volume's root folder")
    return _on(spot, lambda: deps.volume_content.write(uri, file, path, data, meta))


def make_dir(deps: Deps, caller: Caller, spot: Spot, meta: Meta) -> Entry:
    """A new folder (`force`: its missing parents too, and one there already is fine)."""
    uri, file, path = _detached(deps, caller, spot)
    return _on(spot, lambda: deps.volume_content.make_dir(uri, file, path, meta))


def set_meta(deps: Deps, caller: Caller, spot: Spot, meta: Meta) -> Entry:
    uri, file, path = _detached(deps, caller, spot)
    return _on(spot, lambda: deps.volume_content.set_meta(uri, file, path, meta))


def remove(deps: Deps, caller: Caller, spot: Spot) -> None:
    """The file, or the folder and all in it; the root is `PathMissing`, as E2B's."""
    uri, file, path = _detached(deps, caller, spot)
    _on(spot, lambda: deps.volume_content.remove(uri, file, path))
