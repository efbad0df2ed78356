"""The nouns of SPEC §1 as plain values. The store reads and writes these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from rift.domain.clock import iso
from rift.domain.errors import TaskClosed, TaskReleased

TaskStatus = Literal["open", "closed"]
CloseReason = Literal["closed", "idle", "operator"]
VmStatus = Literal["creating", "running", "paused", "failed", "destroyed"]
# A live VM is the task's: it counts against the task's VMs, keeps its SSH port and
# goes when the task closes. A paused one holds only its disk and saved memory.
LIVE_VM_STATUSES: tuple[VmStatus, ...] = ("creating", "running", "paused")
# What holds vCPUs and memory on a host (with a VM whose resume is under way).
HOLDING_VM_STATUSES: tuple[VmStatus, ...] = ("creating", "running")
# A change of a VM's state under way (SPEC §12), recorded before libvirt is asked,
# so reconciliation finishes or rolls back one that a crash cut short.
VmChange = Literal["pausing", "resuming", "snapshotting"]
# Every status but `destroyed`: what a destroy or a close still puts away, and
# what the Boxes page lists.
DESTROYABLE_VM_STATUSES: tuple[VmStatus, ...] = (*LIVE_VM_STATUSES, "failed")
# How a VM came to run (SPEC §11): a cold boot, a pooled VM handed over, a saved
# VM restored, a fork of another VM.
StartKind = Literal["boot", "pool", "restore", "fork"]
# What a VM's guest may reach (SPEC §13): `open`, the networks beyond its host;
# `none`, nothing off the VM; or an allowlist's canonical JSON (rift.domain.egress).
# None of them reaches its host's own services.
Egress = str
ExecStatus = Literal["running", "exited", "killed", "timed_out", "lost"]
DEFAULT_DISK_GIB = 10  # SPEC §3's `disk_gib` default: the size of a VM's overlay


def default_memory_mib(image: str) -> int:
    """SPEC §3: `memory_mib` defaults to 256, and to 512 for `debian` (VMs and pools)."""
    return 512 if image == "debian" else 256

EVENT_TYPES = (
    "opened", "attached", "taken_over", "released", "closed",
    "vm_creating", "vm_running", "vm_failed", "vm_destroyed", "stale_rejected",
    "vm_paused", "vm_resumed", "snapshot_made", "snapshot_deleted",
)


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str | None
    created_at: datetime


@dataclass(frozen=True)
class ApiToken:
    id: str
    user: str
    label: str
    digest: str = field(repr=False)
    created_at: datetime
    revoked_at: datetime | None = None
    operator: bool = False  # `rift token new USER --operator`: sees every VM in /metrics

    @property
    def holder_label(self) -> str:
        return f"api:{self.label}"


@dataclass(frozen=True)
class Task:
    id: str
    owner: str
    name: str
    status: TaskStatus
    lease_gen: int
    secret_digest: str | None = field(repr=False)
    holder: str | None
    held_since: datetime | None
    last_activity_at: datetime
    created_at: datetime
    closed_at: datetime | None = None
    close_reason: CloseReason | None = None
    idempotency_key: str | None = None
    request_digest: str | None = None

    @property
    def is_open(self) -> bool:
        return self.status == "open"

    @property
    def is_held(self) -> bool:
        return self.status == "open" and self.secret_digest is not None

    # Lease and close transitions (SPEC §1). Each answers the task as it is after
    # the change, its lease generation moved on by one, and the event that records
    # it. The store saves the two in one transaction, the task with one
    # compare-and-set on the old generation (`tx.tasks.save(new, expected_gen=
    # old.lease_gen)`), so of two callers racing from one generation one wins.

    def attached(self, by: str, secret_digest: str, now: datetime,
                 details: Mapping[str, Any] | None = None) -> tuple[Task, NewEvent]:
        """Held by ``by`` under a new secret; the lease was free (released or quiet)."""
        return self._held_by("attached", by, secret_digest, now, details)

    def taken_over(self, by: str, secret_digest: str, now: datetime,
                   details: Mapping[str, Any] | None = None) -> tuple[Task, NewEvent]:
        """Held by ``by`` under a new secret, taken from an active holder."""
        return self._held_by("taken_over", by, secret_digest, now, details)

    def released(self, by: str, now: datetime) -> tuple[Task, NewEvent]:
        """Held by no one; the task stays open and its VMs keep running."""
        self._refuse_if_closed()
        if self.secret_digest is None:
            raise TaskReleased(self.id)
        new = self._next(secret_digest=None, holder=None, held_since=None)
        return new, NewEvent(self.id, "released", now, by, {})

    def closed(self, by: str, reason: CloseReason, now: datetime, vm_ids: list[str],
               details: Mapping[str, Any] | None = None) -> tuple[Task, NewEvent]:
        """Closed for ``reason``, held by no one; ``vm_ids`` are the VMs the close
        destroys (after the commit)."""
        self._refuse_if_closed()
        new = self._next(status="closed", closed_at=now, close_reason=reason,
                         secret_digest=None, holder=None, held_since=None)
        return new, NewEvent(self.id, "closed", now, by,
                             {"reason": reason, "vms": vm_ids, **(details or {})})

    def touched(self, now: datetime) -> Task:
        """Activity at ``now``: the idle and quiet clocks start again. Not a lease
        change (the generation stays), and no event: the store moves the clock with
        its own conditional write, at most once per activity step."""
        self._refuse_if_closed()
        return replace(self, last_activity_at=now)

    def _held_by(self, kind: str, by: str, secret_digest: str, now: datetime,
                 details: Mapping[str, Any] | None) -> tuple[Task, NewEvent]:
        self._refuse_if_closed()
        previous = self.holder if self.is_held else None
        new = self._next(secret_digest=secret_digest, holder=by, held_since=now,
                         last_activity_at=now)
        return new, NewEvent(self.id, kind, now, by,
                             {"previous_holder": previous, **(details or {})})

    def _next(self, **changes: Any) -> Task:
        return replace(self, lease_gen=self.lease_gen + 1, **changes)

    def _refuse_if_closed(self) -> None:
        if not self.is_open:
            raise TaskClosed(self.id, iso(self.closed_at), self.close_reason)


@dataclass(frozen=True)
class Vm:
    id: str
    task_id: str
    owner: str
    name: str
    image: str
    status: VmStatus
    host: str
    vcpus: int
    memory_mib: int
    created_at: datetime
    ready_at: datetime | None = None
    destroyed_at: datetime | None = None
    error: str | None = None
    ssh_host: str | None = None
    ssh_port: int | None = None
    idempotency_key: str | None = None
    request_digest: str | None = None
    # Set before a destroy touches libvirt, so a crash in between is finished as a
    # destroy by reconciliation. Kept inside Rift: no view shows it.
    destroy_requested_at: datetime | None = None
    # The size of the VM's copy-on-write overlay; images without a disk ignore it.
    disk_gib: int = DEFAULT_DISK_GIB
    # How it came to run and how long that took from the call (SPEC §11's `start`);
    # both None until it runs, and for ever when it never ran.
    start_kind: StartKind | None = None
    start_ms: int | None = None
    # A pause or resume under way, and since when (None when there is none).
    change: VmChange | None = None
    change_at: datetime | None = None
    egress: Egress = "open"
    # What it uses, sampled while it runs (rift.domain.usage's JSON; None before).
    stats: str | None = None

    @property
    def domain_name(self) -> str:
        return f"rift-{self.id}"

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_VM_STATUSES

    @property
    def keeps_execs(self) -> bool:
        """Its guest still holds its execs: running, or paused with them saved."""
        return self.status in ("running", "paused") and self.destroy_requested_at is None


@dataclass(frozen=True)
class Exec:
    """A command started in a VM's guest (SPEC §10): it runs detached there (its
    output is kept in the guest, not here); this row is its record, changed by
    compare-and-set on `status` from `running` to its end, once."""

    id: str
    task_id: str
    vm_id: str
    owner: str
    command: str
    status: ExecStatus
    timeout_s: int
    started_at: datetime
    ended_at: datetime | None = None
    exit_code: int | None = None
    signal: str | None = None  # the signal that ended it (TERM, KILL, SEGV, ...)
    timed_out: bool = False
    stdout_bytes: int = 0  # all it wrote so far, as last seen
    stderr_bytes: int = 0
    duration_ms: int | None = None

    @property
    def is_running(self) -> bool:
        return self.status == "running"


@dataclass(frozen=True)
class Event:
    id: int
    task_id: str
    type: str
    at: datetime
    actor: str
    details: dict[str, Any]


@dataclass(frozen=True)
class NewEvent:
    """An event before the store gives it an id."""

    task_id: str
    type: str
    at: datetime
    actor: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Host:
    name: str
    uri: str
    vcpus: int
    memory_mib: int
    drained: bool = False
    created_at: datetime | None = None
    unreachable_since: datetime | None = None  # set while the host does not answer
    last_error: str | None = None
