"""Disk (SPEC §15): what a user's work keeps, against `RIFT_MAX_DISK_GIB_PER_USER`,
and what each host has left, against `RIFT_HOST_DISK_RESERVE_GIB`.

Counted: each live VM's overlay as its host last measured it (the usage
sample's `disk_used_bytes`; a guest that fills its disk raises it), the saved
memory of a paused VM (its memory size: the file is at most that), the
bytes of the user's snapshots, and the whole size of each of the user's volumes
(SPEC §18: sparse, but theirs to fill). A call that would add to it (a new VM, a fork, a
snapshot, a pause) is refused with `quota_exceeded` once the user is at or past
the budget; what is there already is never taken away.

Each host's free disk (where its VMs' disks are) is sampled with the usage
figures; a host under its floor takes no new VM (placement leaves it out, and
refuses with `quota_exceeded` naming it when it alone had room), snapshot or
pause, and no pool's new VM (the filler leaves it out too).
"""

from __future__ import annotations

from hypervisor.host_disk import HostDisk
from rift.domain import usage
from rift.domain.errors import HostDiskFull, QuotaExceeded
from rift.services.context import Deps
from rift.services.ports import Tx

GIB = 1 << 30
MIB = 1 << 20


def disk_used_bytes(tx: Tx, user: str) -> int:
    used = tx.snapshots.bytes_of_owner(user) + tx.volumes.gib_of_owner(user) * GIB
    for vm in tx.fleet.live_of_owner(user):
        measured = usage.view(vm.stats) or {}
        used += int(measured.get("disk_used_bytes") or 0)
        if vm.status == "paused":
            used += vm.memory_mib * MIB
    return used


def check_disk_budget(deps: Deps, tx: Tx, user: str) -> None:
    """QuotaExceeded when `user` keeps its whole disk budget or more."""
    limit_gib = deps.limits.max_disk_gib_per_user
    if disk_used_bytes(tx, user) >= limit_gib * GIB:
        raise QuotaExceeded(f"GiB of disk per user ({limit_gib}: overlays, paused VMs' "
                            "memory, snapshots, volumes)", limit_gib,
                            "rift_vm_snapshot_delete or rift_vm_destroy")


def check_volume_room(deps: Deps, tx: Tx, user: str, adding_gib: int) -> None:
    """QuotaExceeded when `adding_gib` more of volume would take `user` past its
    disk budget."""
    limit_gib = deps.limits.max_disk_gib_per_user
    if disk_used_bytes(tx, user) + adding_gib * GIB > limit_gib * GIB:
        raise QuotaExceeded(f"GiB of disk per user ({limit_gib}: overlays, paused VMs' "
                            "memory, snapshots, volumes)", limit_gib,
                            "rift_volume_delete, rift_vm_snapshot_delete or rift_vm_destroy")


def disk_floor_bytes(deps: Deps) -> int:
    return deps.limits.host_disk_reserve_gib * GIB


def check_host_disk(deps: Deps, host: str) -> None:
    """HostDiskFull when `host`'s disk was last seen under its floor."""
    low = deps.disk_room.low(disk_floor_bytes(deps))
    if host in low:
        raise HostDiskFull(host, low[host])


def sample_host_disk(deps: Deps, host: str, disk: HostDisk) -> None:
    """Note how much disk `host` has free where its VMs' disks are (nowhere
    without real guests: libvirt's test driver)."""
    for folder in deps.runtime.disk_folders():
        try:
            deps.disk_room.free[host] = disk.free(str(folder))
        except OSError as exc:
            deps.log.info("host disk not sampled", extra={"host": host, "error": str(exc)})
