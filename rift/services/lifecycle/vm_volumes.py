"""Volumes on `rift_vm_new` (SPEC §18): `volumes: [{volume_id, path, read_only}]`
attached once the new VM runs (a booted one or one handed out from a pool alike),
each through `rift_vm_attach_volume`'s use case.

What would refuse an attach is refused before anything starts (`check`, in the
transaction that records the VM): two of the list at one path or of one volume
(`invalid_argument`), a volume not the caller's (`volume_not_found`), one held
as the one-writer rule forbids (`volume_busy`), volumes on two hosts. The VM is
placed on its volumes' host (`volumes_host`; a pooled VM only from there). A refusal
after the start (a volume taken meanwhile, a guest that would not mount it)
destroys the new VM and answers that refusal: all or none.
"""

from __future__ import annotations

from rift.contract.vms import AttachBody, VmNewIn, VmOut
from rift.contract.volumes import VmAttachVolumeIn
from rift.domain.errors import InvalidArgument, RiftError
from rift.domain.model import Vm
from rift.domain.volumes import check_attachable, mount_path
from rift.services.context import Caller, Deps
from rift.services.lifecycle.teardown import destroy_vm
from rift.services.lifecycle.volume_attach import attach
from rift.services.lifecycle.volume_hosts import answering
from rift.services.lifecycle.volumes import owned_volume
from rift.services.ports import Tx


def check_paths(wanted: list[AttachBody]) -> None:
    """InvalidArgument for a bad path, or two at one path or of one volume."""
    paths = [mount_path(w.path) for w in wanted]
    if len(set(paths)) != len(paths):
        raise InvalidArgument("volumes", "two volumes at one path")
    if len({w.volume_id for w in wanted}) != len(wanted):
        raise InvalidArgument("volumes", "a volume listed twice")


def volumes_host(deps: Deps, tx: Tx, caller: Caller, wanted: list[AttachBody]) -> str | None:
    """The host the new VM goes to: its volumes' (None when it asks for none);
    `invalid_argument` for volumes on two hosts, `volume_not_found` for one not the
    caller's, `no_capacity` for one whose host does not answer (one on a lost host is
    taken to a host that answers: `volume_hosts`)."""
    found = {answering(deps, tx, owned_volume(tx, caller, w.volume_id, lock=True)).host:
             w.volume_id for w in wanted}
    if len(found) > 1:
        named = ", ".join(f"{vol} on {host}" for host, vol in sorted(found.items()))
        raise InvalidArgument("volumes", f"a VM runs on one host, its volumes on several "
                              f"({named})")
    return next(iter(found), None)


def check(tx: Tx, caller: Caller, wanted: list[AttachBody], host: str) -> None:
    """Refuse, before the VM starts, what its attaches would (above)."""
    for w in wanted:
        volume = owned_volume(tx, caller, w.volume_id, lock=True)
        if volume.host != host:
            raise InvalidArgument("volumes", f"{volume.id} is on host {volume.host}, "
                                  f"the new VM on {host}")
        check_attachable(volume, tx.volumes.holders(volume.id), w.read_only)


def attach_at_start(deps: Deps, caller: Caller, cmd: VmNewIn, vm: Vm) -> VmOut | None:
    """Attach `cmd.volumes` to the running `vm`; its view after them, or None when it
    asked for none (or did not start). A refusal destroys the VM and is raised."""
    if not cmd.volumes or vm.status != "running":
        return None
    answer = None
    try:
        for w in cmd.volumes:
            answer = attach(deps, caller, VmAttachVolumeIn(
                handle=cmd.handle, vm_id=vm.id, volume_id=w.volume_id, path=w.path,
                read_only=w.read_only))
    except RiftError as exc:
        destroy_vm(deps, vm, caller.label, {
            "reason": f"a volume of rift_vm_new could not be attached: {exc.message}"})
        raise
    return answer
