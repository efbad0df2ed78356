"""What the store keeps and answers beside the nouns of `model.py`: a host's usage,
the Boxes page's logins and failed-login counts, the change mark its live
stream polls, and the pools of ready VMs.

Plain values here, in the domain, because both sides use them: the engine reads
and writes them through its ports, the store builds them from rows. Neither
package has to import the other.

Two of them have a life, changed only by their methods: each answers the object
as it is after the change (and a snapshot's event), and refuses a state the change
does not start from with `IllegalTransition`. The store saves the answer with one
compare-and-set on the state it was read in (``tx.pools.save_vm(new, was=old)``,
``tx.snapshots.save(new, was=old)``: ``UPDATE ... WHERE id = ? AND state = ?``),
so of two callers changing one row one wins. A row that goes (a pooled VM handed
out or removed, a snapshot abandoned or deleted) is deleted the same way
(``tx.pools.take(vm)``, ``tx.snapshots.remove(snap)``). No version column: the
state is what every change reads and moves, so it is the version.

A pooled VM (SPEC §11)::

    from         method             to           by
    (none)       -                  starting     pools' fill: the row, then its domain boots
    starting     saving(key)        saving       a `saved` pool's VM answers: libvirt saves it
    starting     settled(key, now)  ready        a `running` pool's VM answers
    saving       settled(key, now)  saved        its memory is on disk
    ready        handed_out()       (row goes)   a new VM takes it (a VM row of its id)
    saved        handed_out()       (row goes)   a new VM restores it
    any          destroying()       destroying   cleared, replaced, failed: its domain goes
    starting     removed()          (row goes)   its domain was never defined
    saving       removed()          (row goes)   (as starting)
    destroying   removed()          (row goes)   its domain and files are gone

(`settled` from `starting` to `saved` and from `saving` to `ready` follow the
pool's goal too: the state it ends in is the goal's end.)

A snapshot (SPEC §12)::

    from       method                 to           event
    (none)     -                      making       (its VM turns `snapshotting`)
    making     made(bytes, key, ...)  ready        snapshot_made
    ready      deleting(by, now, ..)  deleting     snapshot_deleted
    making     removed()              (row goes)   - (abandoned: the save failed or a crash cut it)
    deleting   removed()              (row goes)   - (its files are gone)
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from rift.domain.errors import IllegalTransition
from rift.domain.model import NewEvent


@dataclass(frozen=True)
class HostUsage:
    """vCPUs and memory of the live VMs on one host, and how many there are."""

    vcpus: int
    memory_mib: int
    vms: int


@dataclass(frozen=True)
class WebSession:
    """A Boxes page login: only the SHA-256 digest of the random session id is kept."""

    digest: str = field(repr=False)
    user: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class LoginFailures:
    """Failed logins counted under one key (a user name and client address, or an address)."""

    key: str
    failures: int
    last_failed_at: datetime


@dataclass(frozen=True)
class ChangeMark:
    """Moves whenever anything the Boxes page shows may have changed: every state
    change appends an event, a touch moves an open task's last activity, and each
    round of usage sampling (VMs' `stats`) sets its own mark."""

    last_event_id: int
    last_activity_at: datetime | None
    usage_mark: str | None = None

    @property
    def token(self) -> str:
        at = "" if self.last_activity_at is None else str(
            int(self.last_activity_at.timestamp() * 1_000_000))
        return f"{self.last_event_id}.{at}.{self.usage_mark or ''}"


PoolGoal = Literal["running", "saved"]
# starting: its domain boots; ready: it runs and answers (a running pool's end);
# saving: libvirt saves it; saved: its memory is on disk, its domain stopped;
# destroying: its domain is being taken down (the row goes after it).
PoolVmState = Literal["starting", "ready", "saving", "saved", "destroying"]
# Pool VMs that hold vCPUs and memory on their host (a saved one holds only disk).
POOL_RUNNING_STATES: tuple[PoolVmState, ...] = ("starting", "ready", "saving", "destroying")


@dataclass(frozen=True)
class Pool:
    """VMs of one image and size that Rift keeps ready (SPEC §11): `running` of them
    booted, `saved` of them booted and saved to disk. `host` None: any host
    placement picks. `filler`/`fill_until`: the replica filling it now (one at a
    time); `failures`/`retry_at`: the back-off after failed starts."""

    id: str
    image: str
    host: str | None
    vcpus: int
    memory_mib: int
    running: int
    saved: int
    created_at: datetime
    failures: int = 0
    retry_at: datetime | None = None
    last_error: str | None = None
    filler: str | None = None
    fill_until: datetime | None = None


@dataclass(frozen=True)
class PoolVm:
    """One pooled VM: no one's until it is handed out, when its row goes and a VM
    row of the same id takes its place (in one transaction). Its domain and files
    are named after that id from the start; `key_id` names the pool key it booted
    with; `mark` is what it was built from (the image's build and the host's
    QEMU and libvirt), so a change replaces it."""

    id: str
    pool_id: str
    goal: PoolGoal
    state: PoolVmState
    host: str
    image: str
    vcpus: int
    memory_mib: int
    key_id: str
    mark: str
    created_at: datetime
    ssh_port: int | None = None
    host_key: str | None = None  # pinned when it first answered: a restore checks it
    ready_at: datetime | None = None

    # Its transitions: the table in this module's docstring.

    def saving(self, host_key: str | None) -> PoolVm:
        """It answered; libvirt is to save it (a `saved` pool's VM)."""
        _from("pool VM", self.id, self.state, ("starting",), "saving")
        return replace(self, state="saving", host_key=host_key)

    def settled(self, host_key: str | None, now: datetime) -> PoolVm:
        """Its start is done: `ready` (a `running` pool's) or `saved`, ready to hand out."""
        _from("pool VM", self.id, self.state, ("starting", "saving"), "settled")
        return replace(self, state="saved" if self.goal == "saved" else "ready",
                       host_key=host_key, ready_at=now)

    def destroying(self) -> PoolVm:
        """No hand-out takes it any more: its domain and files are to go (from any
        state, and again from `destroying` when a destroy was cut)."""
        return replace(self, state="destroying")

    def handed_out(self) -> PoolVm:
        """Taken for a new VM (its row goes; a VM row of its id takes its place)."""
        _from("pool VM", self.id, self.state, ("ready", "saved"), "handed out")
        return self

    def removed(self) -> PoolVm:
        """Its row goes: its domain never came (starting, saving) or is gone (destroying)."""
        _from("pool VM", self.id, self.state, ("starting", "saving", "destroying"), "removed")
        return self


# A snapshot's life (SPEC §12): `making` while the VM is saved and its disk copied,
# `ready` once it can be forked, `deleting` while its files go (then the row goes).
SnapshotState = Literal["making", "ready", "deleting"]


@dataclass(frozen=True)
class Snapshot:
    """A VM's memory and disk as of one moment, kept on its host for forks: its
    files (`snapshots/<id>/` there) are the saved memory and, for images with a
    disk, a copy of the VM's overlay. It belongs to the task."""

    id: str
    task_id: str
    vm_id: str
    owner: str
    name: str
    host: str
    image: str
    vcpus: int
    memory_mib: int
    disk_gib: int
    state: SnapshotState
    created_at: datetime
    bytes: int = 0  # its files' size on the host's disk
    host_key: str | None = None  # the guest's SSH host key when it was taken

    # Its transitions: the table in this module's docstring.

    def made(self, size: int, host_key: str | None, by: str,
             now: datetime) -> tuple[Snapshot, NewEvent]:
        """Its files are written (``size`` bytes): it can be forked."""
        _from("snapshot", self.id, self.state, ("making",), "made")
        new = replace(self, state="ready", bytes=size, host_key=host_key)
        return new, NewEvent(self.task_id, "snapshot_made", now, by, {
            "snapshot_id": self.id, "vm_id": self.vm_id, "name": self.name, "bytes": size})

    def deleting(self, by: str, now: datetime,
                 reason: str | None = None) -> tuple[Snapshot, NewEvent]:
        """Deleted: no fork starts from it; its files go next, then its row."""
        _from("snapshot", self.id, self.state, ("ready",), "deleted")
        details: dict[str, Any] = {"snapshot_id": self.id, "vm_id": self.vm_id}
        if reason is not None:
            details["reason"] = reason
        return replace(self, state="deleting"), NewEvent(self.task_id, "snapshot_deleted",
                                                         now, by, details)

    def removed(self) -> Snapshot:
        """Its row goes: abandoned while `making`, or its files gone once `deleting`."""
        _from("snapshot", self.id, self.state, ("making", "deleting"), "removed")
        return self


def _from(kind: str, object_id: str, state: str, sources: Collection[str],
          transition: str) -> None:
    if state not in sources:
        raise IllegalTransition(kind, object_id, state, transition)


@dataclass(frozen=True)
class Exposure:
    """One TCP port of a running VM reachable through Rift (SPEC §13) at a URL whose
    secret only its holder knows: the store keeps the secret's SHA-256 `digest`.
    Exposing the port again replaces the row (the old URL stops working); the row
    goes when the port is unexposed or the VM is destroyed."""

    id: str
    vm_id: str
    task_id: str
    owner: str
    port: int
    digest: str = field(repr=False)
    created_at: datetime
