"""E2B's `volumeMounts` (SPEC §16, §18): on a sandbox's create, `[{name, path}]` by
volume name are the new VM's `volumes` on `rift_vm_new` (attached writable once it
runs, placed on their host: rift.services.lifecycle.vm_volumes), or attached to a
fork (a sandbox from a snapshot) once it runs; a sandbox's detail and list answer
them by name. Blocking."""

from __future__ import annotations

from typing import Any

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.views import VmView
from rift.contract.vms import MAX_START_VOLUMES, AttachBody
from rift.contract.volumes import VmAttachVolumeIn
from rift.domain.errors import InvalidArgument, VolumeNotFound
from rift.services.context import Caller, Deps
from rift.services.lifecycle import tasks, volume_attach
from rift.services.ports import Tx


def mounts_of(deps: Deps, caller: Caller, body: dict[str, Any]) -> list[AttachBody]:
    """`volumeMounts` of a create, as rift_vm_new's `volumes`: each names one of the
    caller's volumes (`volume_not_found`, 404, otherwise) and a path, writable."""
    wanted = body.get("volumeMounts") or []
    if not isinstance(wanted, list) or len(wanted) > MAX_START_VOLUMES or not all(
            isinstance(w, dict) and isinstance(w.get("name"), str)
            and isinstance(w.get("path"), str) for w in wanted):
        raise InvalidArgument("volumeMounts", f"a list of at most {MAX_START_VOLUMES} "
                              "{name, path} objects")
    if not wanted:
        return []
    with deps.store.read() as tx:
        by_name = {v.name: v.id for v in tx.volumes.of_owner(caller.user)
                   if v.state == "ready"}
    mounts = []
    for w in wanted:
        if w["name"] not in by_name:
            raise VolumeNotFound(w["name"])
        mounts.append(command(AttachBody, volume_id=by_name[w["name"]], path=w["path"]))
    return mounts


def attach_to_fork(deps: Deps, caller: Caller, handle: str, vm: VmView,
                   mounts: list[AttachBody]) -> VmView:
    """A sandbox from a snapshot (a fork, running) with `mounts` attached; a refused one
    closes its task (the fork goes) and is raised."""
    try:
        for mount in mounts:
            vm = volume_attach.attach(deps, caller, VmAttachVolumeIn(
                handle=handle, vm_id=vm.id, volume_id=mount.volume_id, path=mount.path,
                read_only=mount.read_only)).vm
    except BaseException:
        tasks.close(deps, caller, command(c.TaskCloseIn, handle=handle))
        raise
    return vm


def mounted(tx: Tx, vm_ids: list[str]) -> dict[str, list[dict[str, str]]]:
    """E2B's `volumeMounts` ([{name, path}]) of each VM, by VM id."""
    found = tx.volumes.of_vms(vm_ids)
    names: dict[str, str] = {}
    answer: dict[str, list[dict[str, str]]] = {}
    for vm_id, held in found.items():
        answer[vm_id] = []
        for attachment in held:
            if attachment.state != "attached":
                continue
            if attachment.volume_id not in names:
                volume = tx.volumes.get(attachment.volume_id)
                names[attachment.volume_id] = volume.name if volume else attachment.volume_id
            answer[vm_id].append({"name": names[attachment.volume_id],
                                  "path": attachment.path})
    return answer
