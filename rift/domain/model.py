"""The nouns of SPEC §1 as plain values. The store reads and writes these."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

TaskStatus = Literal["open", "closed"]
CloseReason = Literal["closed", "idle", "operator"]
VmStatus = Literal["creating", "running", "failed", "destroyed"]
LIVE_VM_STATUSES: tuple[VmStatus, ...] = ("creating", "running")

EVENT_TYPES = (
    "opened", "attached", "taken_over", "released", "closed",
    "vm_creating", "vm_running", "vm_failed", "vm_destroyed", "stale_rejected",
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

    @property
    def domain_name(self) -> str:
        return f"rift-{self.id}"

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_VM_STATUSES


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
