"""What `rift host drain NAME --move` does with volumes (SPEC §14, §18): a VM holding
volumes moves with them, to a host of the machine their files are on.

A volume's file lives on its host's machine (`RIFT_DATA_DIR/volumes/`, shared by
every host whose libvirt runs there; a host elsewhere's go with their VM, below).
So the live migration carries the VM's memory (and its own disk), not the volume: the
destination's QEMU opens the same file, which the source's wrote out before it
handed over, and the volume's row then names the destination (`Volume.moved`, in
the transaction that records the VM moved). The VMs that share a volume (its
readers) move together, to one host; one that cannot move keeps them all where
they are, and the report says why. The volumes no VM holds follow too, to the
first host of the machine taking VMs (by name, where a new volume would go), so
the drained host keeps none of them (`rift host remove` needs that).

A volume on a host elsewhere has its file on that host's machine only, so it goes
with its VM (`carry`): its frozen parents and an empty overlay are put on the
destination first (`VolumeFiles.send`, through this machine), the migration
streams the volume's top layer with the VM's memory (QEMU's NBD mirror, in the
migration TLS: a write during the move lands on both ends), and once the VM runs
there its rows name the destination and the file goes from the source. A volume
there held by more than one VM (readers) does not move (`volume_busy` in the
report: a copy per host would leave two files, one of them stale); a volume
there no VM holds is copied whole to the first host taking VMs.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypervisor.base import HypervisorError, ImageError
from rift.domain.model import Vm
from rift.domain.volumes import Attachment
from rift.services.context import Deps
from rift.services.lifecycle.volumes import moved as volumes_changed
from rift.services.operator.move_copies import Copy, record, settle
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


def carried_groups(groups: list[list[Vm]], held: Mapping[str, list[Attachment]],
                   holders: Mapping[str, list[Attachment]],
                   ) -> tuple[list[list[Vm]], dict[str, str]]:
    """Of the groups leaving a host elsewhere, those whose volumes can go with them (a
    volume there moves with its one VM), and why each VM of the others stays."""
    keep, stays = [], {}
    for group in groups:
        shared = next(((att.volume_id, sorted(h.vm_id for h in holders[att.volume_id]))
                       for vm in group for att in held.get(vm.id, [])
                       if len(holders.get(att.volume_id, [])) > 1), None)
        if shared is None:
            keep.append(group)
            continue
        volume, vms = shared
        why = (f"volume_busy: volume {volume}, on a host elsewhere, is held by VMs "
               f"{', '.join(vms)}; it moves with one VM only: rift_vm_detach_volume it "
               "from the others")
        stays.update({vm.id: why for vm in group})
    return keep, stays


def carry(deps: Deps, held: list[Attachment], source_uri: str, dest_uri: str) -> None:
    """Put the VM's volumes on the destination before its migration (a read-only one
    whole: nobody writes it). HypervisorError when a file could not go (what was put
    there goes)."""
    sent: list[str] = []
    try:
        for att in held:
            deps.volume_files.send(source_uri, dest_uri, att.volume_id, att.read_only)
            sent.append(att.volume_id)
    except (OSError, ImageError) as exc:
        drop(deps, sent, dest_uri)
        raise HypervisorError("migrate", f"volume {att.volume_id} could not be put on "
                                         f"the destination: {exc}") from exc


def drop(deps: Deps, volume_ids: list[str], uri: str) -> None:
    """Best effort: the volumes' files go from the host at `uri` (a move left it, or
    did not happen)."""
    for volume_id in volume_ids:
        try:
            deps.volume_files.remove(uri, volume_id)
        except (OSError, ImageError) as exc:
            deps.log.warning("a moved volume's old file stays", extra={
                "volume_id": volume_id, "uri": uri, "error": str(exc)})


def move_detached_far(deps: Deps, source: str, source_uri: str, dest: str,
                      dest_uri: str) -> list[str]:
    """The volumes on host `source` (elsewhere) that no VM holds are copied whole to
    host `dest` and name it, their old files removed; answers their ids."""
    with deps.store.read() as tx:
        idle = [v.id for v in tx.volumes.on_host(source)
                if v.state == "ready" and not tx.volumes.holders(v.id)]
    went = []
    for volume_id in idle:
        copy = [Copy("volume", volume_id, dest_uri)]
        record(deps, copy)  # a drain killed before the row names it: reconciliation
        try:
            deps.volume_files.send(source_uri, dest_uri, volume_id, True)
        except (OSError, ImageError) as exc:
            deps.log.warning("a volume could not leave a drained host", extra={
                "volume_id": volume_id, "host": source, "error": str(exc)})
            continue
        with deps.store.write() as tx:
            locked = tx.volumes.get(volume_id, lock=True)
            ok = (locked is not None and locked.state == "ready" and locked.host == source
                  and not tx.volumes.holders(volume_id))
            if ok and locked is not None:
                tx.volumes.save(locked.moved(dest), locked)
                volumes_changed(tx)
        drop(deps, [volume_id], source_uri if ok else dest_uri)
        if ok:
            settle(deps, copy)
            went.append(volume_id)
    return went
