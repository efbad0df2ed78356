"""An E2B sandbox's settings (SPEC §16): what the E2B door keeps beside the VM it
is, so that a restart or another replica knows them (migration 0015).

Never the sandbox's `envdAccessToken` (its task's handle) nor anything derived
from it; of its `trafficAccessToken` only the SHA-256 digest. `on_timeout` and
`auto_resume` are the create body's wishes (`autoPause`, `lifecycle`): at
`end_at` the door kills the sandbox, or (`pause`) puts its VM to sleep (SPEC
§17) and drops `end_at`: None means asleep since its end, E2B's `paused`, woken
by `connect`, or with `auto_resume` by its traffic too (rift.e2b.asleep)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

OnTimeout = Literal["kill", "pause"]


@dataclass(frozen=True)
class Sandbox:
    vm_id: str
    owner: str
    task_id: str
    template: str
    started_at: datetime
    end_at: datetime | None
    metadata: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict, repr=False)
    secure: bool = False
    # Reached without the traffic token (`network.allowPublicTraffic`), when the
    # operator allows it too (RIFT_E2B_PUBLIC_PORTS).
    public_traffic: bool = True
    traffic_digest: str | None = field(default=None, repr=False)
    on_timeout: OnTimeout = "kill"
    auto_resume: bool = False
