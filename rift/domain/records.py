"""What the store keeps and answers beside the nouns of `model.py`: a host's usage,
the Boxes page's logins and failed-login counts, and the change mark its live
stream polls.

Plain values here, in the domain, because both sides use them: the engine reads
and writes them through its ports, the store builds them from rows. Neither
package has to import the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


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
    change appends an event, and a touch moves an open task's last activity."""

    last_event_id: int
    last_activity_at: datetime | None

    @property
    def token(self) -> str:
        at = "" if self.last_activity_at is None else str(
            int(self.last_activity_at.timestamp() * 1_000_000))
        return f"{self.last_event_id}.{at}"
