"""What `rift host drain NAME --move` does with volumes (SPEC §14, §18): a VM holding
volumes moves with them, to a host of the machine their files are on.

A volume's file lives on its host's machine (`RIFT_DATA_DIR/volumes/`, shared by
every host whose libvirt runs there; a host elsewhere's do not move yet). So the
live migration carries the VM's memory (and its own disk), not the volume: the
destination's QEMU opens the same file, which the source's wrote out before it
handed over, and the volume's row then names the destination (`Volume.moved`, in
the transaction that records the VM moved). The VMs that share a volume (its
readers) move together, to one host; one that cannot move keeps them all where
they are, and the report says why. The volumes no VM holds follow too, to the
first host of the machine taking VMs (by name, where a new volume would go), so
the drained host keeps none of them (`rift host remove` needs that).
"""

from __future__ import annotations

from collections.abc import Mapping

from rift.domain.model import Vm
from rift.domain.volumes import Attachment
from rift.services.context import Deps
from rift.services.lifecycle.volumes import moved as volumes_changed
from rift.services.ports import Tx


def move_groups(live: list[Vm], movable: set[str], held: Mapping[str, list[Attachment]],
                holders: Mapping[str, list[Attachment]],
                ) -> tuple[list[list[Vm]], dict[str, str]]:
    """The movable VMs in groups that move together (those sharing a volume; a VM
    without volumes is a group of its own), and those that stay for a VM they
    share a volume with (id -> why)."""
    parent = {vm.id: vm.id for vm in live}

    def root(vm_id: str) -> str:
        while parent[vm_id] != vm_id:
            vm_id = parent[vm_id]
        return vm_id

    outside: dict[str, tuple[str, str]] = {}  # group root -> (volume, a holder not here)
    for vm in live:
        for att in held.get(vm.id, []):
            for other in holders.get(att.volume_id, []):
                if other.vm_id not in parent:
                    outside[vm.id] = (att.volume_id, other.vm_id)
                    continue
                parent[root(other.vm_id)] = root(vm.id)
    groups: dict[str, list[Vm]] = {}
    for vm in live:
        groups.setdefault(root(vm.id), []).append(vm)
    for vm_id, shared in list(outside.items()):
        outside[root(vm_id)] = shared
    moving, stays = [], {}
    for key, members in groups.items():
        stuck = [vm for vm in members if vm.id not in movable]
        if key in outside:
            volume, holder = outside[key]
            reason = f"it shares volume {volume} with VM {holder}, which is on another host"
        elif stuck:
            reason = f"it shares volumes with VM {stuck[0].id}, which stays"
        else:
            moving.append(members)
            continue
        stays.update({vm.id: reason for vm in members if vm.id in movable})
    return moving, stays


def follow(tx: Tx, vm_id: str, dest: str) -> list[str]:
    """Each volume the VM holds now names host `dest` (its VM went there); answers
    the ids that moved."""
    went = []
    for att in tx.volumes.of_vms([vm_id])[vm_id]:
        volume = tx.volumes.get(att.volume_id, lock=True)
        if volume is not None and volume.host != dest and volume.state == "ready":
            tx.volumes.save(volume.moved(dest), volume)
            went.append(volume.id)
    if went:
        volumes_changed(tx)
    return went


def move_detached(deps: Deps, source: str, dest: str) -> list[str]:
    """The volumes on host `source` that no VM holds name host `dest` (both of this
    machine); answers their ids."""
    went = []
    with deps.store.write() as tx:
        for volume in tx.volumes.on_host(source):
            if volume.state == "ready" and not tx.volumes.holders(volume.id):
                locked = tx.volumes.get(volume.id, lock=True)
                if locked is not None and locked.state == "ready" and locked.host == source:
                    tx.volumes.save(locked.moved(dest), locked)
                    went.append(volume.id)
        if went:
            volumes_changed(tx)
    return went
