"""What the store keeps and answers beside the nouns of `model.py`: a host's usage,
the Boxes page's logins and failed-login counts, the change mark its live
stream polls, the client budgets' windows, snapshots and exposures (the pools of
ready VMs are `pools.py`).

Plain values here, in the domain, because both sides use them: the engine reads
and writes them through its ports, the store builds them from rows. Neither
package has to import the other.

A snapshot has a life, changed only by its methods: each answers the snapshot as
it is after the change (and its event), and refuses a state the change does not
start from with `IllegalTransition`. The store saves the answer with one
compare-and-set on the state it was read in (``tx.snapshots.save(new, was=old)``:
``UPDATE ... WHERE id = ? AND state = ?``), so of two callers changing one row one
wins; a snapshot abandoned or deleted goes the same way (``tx.snapshots.remove(snap)``).
No version column: the state is what every change reads and moves, so it is the
version.

A snapshot (SPEC §12)::

    from       method                 to           event
    (none)     -                      making       (its VM turns `snapshotting`)
    making     made(bytes, key, ...)  ready        snapshot_made
    ready      deleting(by, now, ..)  deleting     snapshot_deleted
    making     removed()              (row goes)   - (abandoned: the save failed or a crash cut it)
    deleting   removed()              (row goes)   - (its files are gone)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from rift.domain.errors import check_from
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


# What a client budget counts (SPEC §15): tasks, VMs and execs a user made (by their
# owner), a task's stale-handle refusals (its `stale_rejected` events, by its id).
RateKind = Literal["tasks", "vms", "execs", "stale_rejected"]


@dataclass(frozen=True)
class RateWindow:
    """How many rows of one kind one key made since a time, and when the oldest of
    them came (None when there is none)."""

    count: int
    oldest: datetime | None


@dataclass(frozen=True)
class ChangeMark:
    """Moves whenever anything the Boxes page shows may have changed: every state
    change appends an event, a touch moves an open task's last activity, each
    round of usage sampling (VMs' `stats`) sets its own mark, and so does each
    change of a volume (they belong to no task: SPEC §18) and of a VM's code
    contexts (a run appends no event: SPEC §20)."""

    last_event_id: int
    last_activity_at: datetime | None
    usage_mark: str | None = None
    volumes_mark: str | None = None
    code_mark: str | None = None

    @property
    def token(self) -> str:
        at = "" if self.last_activity_at is None else str(
            int(self.last_activity_at.timestamp() * 1_000_000))
        return (f"{self.last_event_id}.{at}.{self.usage_mark or ''}.{self.volumes_mark or ''}"
                f".{self.code_mark or ''}")


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
        check_from("snapshot", self.id, self.state, ("making",), "made")
        new = replace(self, state="ready", bytes=size, host_key=host_key)
        return new, NewEvent(self.task_id, "snapshot_made", now, by, {
            "snapshot_id": self.id, "vm_id": self.vm_id, "name": self.name, "bytes": size})

    def deleting(self, by: str, now: datetime,
                 reason: str | None = None) -> tuple[Snapshot, NewEvent]:
        """Deleted: no fork starts from it; its files go next, then its row."""
        check_from("snapshot", self.id, self.state, ("ready",), "deleted")
        details: dict[str, Any] = {"snapshot_id": self.id, "vm_id": self.vm_id}
        if reason is not None:
            details["reason"] = reason
        return replace(self, state="deleting"), NewEvent(self.task_id, "snapshot_deleted",
                                                         now, by, details)

    def removed(self) -> Snapshot:
        """Its row goes: abandoned while `making`, or its files gone once `deleting`."""
        check_from("snapshot", self.id, self.state, ("making", "deleting"), "removed")
        return self


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
