"""The task, VM, event and exec views of SPEC §3 and §10: what the engine answers, what both
doors publish as output schemas, and what the Boxes page renders. They are built
in one place, rift/services/read/views.py (DESIGN 21)."""

from __future__ import annotations

from typing import Any, Literal

from rift.contract.base import Output
from rift.domain.model import StartKind

VmStatusView = Literal["creating", "running", "paused", "sleeping", "failed", "destroyed"]


class SshView(Output):
    host: str | None
    port: int


class StartView(Output):
    """How a VM came to run (SPEC §11): `boot` (a cold boot), `pool`, `restore` or
    `fork`, and the milliseconds from the call to running."""

    kind: StartKind
    ms: int


class WokeView(Output):
    """How long the VM's last wake from sleep (SPEC §17) took, from the call that
    woke it to its guest answering."""

    ms: int


class PortView(Output):
    """An exposed guest port as the VM view lists it (never its URL)."""

    port: int
    created_at: str


class StatsView(Output):
    """What a running VM uses (SPEC §14), at most one sample interval old: CPU over
    the last interval (% of its vCPUs; null until a second sample), the QEMU
    process's resident memory, its disk's allocation on the host, and the guest's
    network counters (read at most once a sweep interval)."""

    cpu_pct: float | None
    memory_used_mib: int | None
    disk_used_bytes: int | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None
    at: str


class AllowView(Output):
    """An egress allowlist (SPEC §13): the names and CIDRs the guest may reach."""

    allow: list[str]


class ExposureView(Output):
    """An exposure as `rift_vm_expose` answers it: the only time its URL is shown."""

    vm_id: str
    port: int
    url: str
    created_at: str

class VolumeMountView(Output):
    """A volume attached to a VM (SPEC §18): where its guest mounts it, and whether
    read-only."""

    volume_id: str
    path: str
    read_only: bool


class VmCodeContextView(Output):
    """A code context of a VM (SPEC §20) as Rift last saw it: its language and
    folder, its last run (when it ended, its status, the kernel's execution count)
    and the run in flight (its id) if any. rift_vm_code_context_list asks the guest."""

    id: str
    language: str
    cwd: str | None
    last_run_at: str | None
    last_status: str | None
    execution_count: int | None
    running: str | None


class VolumeAttachmentView(Output):
    """Where a volume is attached: the VM, its task, the path, read-only or not."""

    vm_id: str
    task_id: str
    path: str
    read_only: bool


class VolumeView(Output):
    """A user's volume (SPEC §18): ext4 on a sparse disk of `size_gib` on `host`,
    kept until deleted; `parent_id` the volume it was cloned from; `used_bytes` what
    it takes on its host, as last sampled (null before the first sample);
    `host_unreachable_since` set while its host does not answer (past
    RIFT_HOST_LOST_S the VMs that held it failed; the volume waits for its host)."""

    id: str
    name: str
    size_gib: int
    host: str
    created_at: str
    parent_id: str | None
    attached_to: list[VolumeAttachmentView]
    used_bytes: int | None
    host_unreachable_since: str | None


class VmView(Output):
    id: str
    task_id: str
    name: str
    image: str
    status: VmStatusView
    host: str
    vcpus: int
    memory_mib: int
    disk_gib: int
    ssh: SshView | None
    created_at: str
    ready_at: str | None
    destroyed_at: str | None
    error: str | None
    start: StartView | None
    woke: WokeView | None
    egress: Literal["open", "none"] | AllowView
    exposures: list[PortView]
    volumes: list[VolumeMountView]
    code_contexts: list[VmCodeContextView]
    stats: StatsView | None

class KeptVolumeView(Output):
    """A volume a snapshot keeps (SPEC §18), as its VM held it when it was taken: at
    `path`, read-only or not, `size_gib` then. A fork of the snapshot attaches it
    (read-only, at `path`) only where `forks_attach`: the VM held it read-only (and
    still does when the fork starts); rift_volume_clone with the snapshot's id makes
    a volume of any of them."""

    volume_id: str
    path: str
    read_only: bool
    size_gib: int
    forks_attach: bool


class SnapshotView(Output):
    """A VM's memory and disk as of one moment (SPEC §12), kept for forks, and the
    volumes it keeps (SPEC §18)."""

    id: str
    task_id: str
    vm_id: str
    name: str
    created_at: str
    bytes: int
    volumes: list[KeptVolumeView]

class TaskView(Output):
    id: str
    name: str
    owner: str
    status: Literal["open", "closed"]
    holder: str | None
    held_since: str | None
    last_activity_at: str
    lease_quiet_at: str | None
    closes_at: str | None
    created_at: str
    closed_at: str | None
    close_reason: Literal["closed", "idle", "operator"] | None
    # SPEC §17: quiet this long, its running VMs sleep (its own, else the operator's
    # RIFT_TASK_SLEEP_S; 0 never); `always` with execs running too, `idle` only without.
    sleep_after_s: int
    sleep: Literal["idle", "always"]
    vms: list[VmView]
    running_execs: int
    snapshots: list[SnapshotView]

class EventView(Output):
    id: int
    type: str
    at: str
    actor: str
    details: dict[str, Any]

ExecStatusView = Literal["running", "exited", "killed", "timed_out", "lost"]


class ExecView(Output):
    """An exec (SPEC §10). `stdout`/`stderr` are the bytes this answer carries
    (UTF-8, invalid bytes replaced; empty in lists); `*_offset` is where the next
    read starts; `*_bytes` all the stream wrote so far; `truncated`: a read from
    before the oldest byte the guest keeps started there."""

    exec_id: str
    vm_id: str
    command: str
    status: ExecStatusView
    exit_code: int | None
    signal: str | None
    timed_out: bool
    started_at: str
    ended_at: str | None
    duration_ms: int | None
    stdout: str
    stderr: str
    stdout_offset: int
    stderr_offset: int
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool
