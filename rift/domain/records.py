"""What the store keeps and answers beside the nouns of `model.py`: a host's usage,
the Boxes page's logins and failed-login counts, the change mark its live
stream polls, and the pools of ready VMs.

Plain values here, in the domain, because both sides use them: the engine reads
and writes them through its ports, the store builds them from rows. Neither
package has to import the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal


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
