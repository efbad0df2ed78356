"""The task, VM, event and exec views of SPEC §3 and §10: what the engine answers, what both
doors publish as output schemas, and what the Boxes page renders. Built from the
store's values without a second validation (`model_construct`): the builders are
the only way in, and the doors' output schemas are checked against them in the
tests."""

from __future__ import annotations

from typing import Any, Literal

from rift.contract.base import Output
from rift.domain import egress as egress_rules
from rift.domain import usage
from rift.domain.clock import iso
from rift.domain.leases import LeaseRules
from rift.domain.model import Event, Exec, StartKind, Task, Vm
from rift.domain.records import Exposure, Snapshot

VmStatusView = Literal["creating", "running", "paused", "failed", "destroyed"]


class SshView(Output):
    host: str | None
    port: int


class StartView(Output):
    """How a VM came to run (SPEC §11): `boot` (a cold boot), `pool`, `restore` or
    `fork`, and the milliseconds from the call to running."""

    kind: StartKind
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


def _stats_view(stats: str | None) -> StatsView | None:
    now = usage.view(stats)
    return StatsView.model_construct(**now) if now is not None else None


class AllowView(Output):
    """An egress allowlist (SPEC §13): the names and CIDRs the guest may reach."""

    allow: list[str]


def _egress_view(egress: str) -> Literal["open", "none"] | AllowView:
    listed = egress_rules.entries(egress)
    if listed is None:
        return "none" if egress == "none" else "open"
    return AllowView.model_construct(allow=listed)


class ExposureView(Output):
    """An exposure as `rift_vm_expose` answers it: the only time its URL is shown."""

    vm_id: str
    port: int
    url: str
    created_at: str

    @classmethod
    def of(cls, exposure: Exposure, url: str) -> ExposureView:
        return cls.model_construct(vm_id=exposure.vm_id, port=exposure.port, url=url,
                                   created_at=iso(exposure.created_at) or "")


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
    egress: Literal["open", "none"] | AllowView
    exposures: list[PortView]
    stats: StatsView | None

    @classmethod
    def of(cls, vm: Vm, exposures: list[Exposure] | None = None) -> VmView:
        reachable = vm.status == "running" and vm.ssh_port is not None
        return cls.model_construct(
            id=vm.id, task_id=vm.task_id, name=vm.name, image=vm.image, status=vm.status,
            host=vm.host, vcpus=vm.vcpus, memory_mib=vm.memory_mib, disk_gib=vm.disk_gib,
            ssh=SshView.model_construct(host=vm.ssh_host, port=vm.ssh_port)
            if reachable and vm.ssh_port is not None else None,
            created_at=iso(vm.created_at) or "", ready_at=iso(vm.ready_at),
            destroyed_at=iso(vm.destroyed_at), error=vm.error,
            start=StartView.model_construct(kind=vm.start_kind, ms=vm.start_ms)
            if vm.start_kind is not None and vm.start_ms is not None else None,
            egress=_egress_view(vm.egress),
            exposures=[PortView.model_construct(port=e.port, created_at=iso(e.created_at) or "")
                       for e in exposures or []],
            stats=_stats_view(vm.stats) if vm.status == "running" else None)


class SnapshotView(Output):
    """A VM's memory and disk as of one moment (SPEC §12), kept for forks."""

    id: str
    task_id: str
    vm_id: str
    name: str
    created_at: str
    bytes: int

    @classmethod
    def of(cls, snap: Snapshot) -> SnapshotView:
        return cls.model_construct(id=snap.id, task_id=snap.task_id, vm_id=snap.vm_id,
                                   name=snap.name, created_at=iso(snap.created_at) or "",
                                   bytes=snap.bytes)


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
    vms: list[VmView]
    running_execs: int
    snapshots: list[SnapshotView]

    @classmethod
    def of(cls, task: Task, vms: list[Vm], rules: LeaseRules,
           running_execs: int = 0, snapshots: list[Snapshot] | None = None,
           exposures: dict[str, list[Exposure]] | None = None) -> TaskView:
        held = task.is_held
        return cls.model_construct(
            id=task.id, name=task.name, owner=task.owner, status=task.status,
            holder=task.holder if held else None,
            held_since=iso(task.held_since) if held else None,
            last_activity_at=iso(task.last_activity_at) or "",
            lease_quiet_at=iso(rules.lease_quiet_at(task)) if held else None,
            closes_at=iso(rules.closes_at(task)), created_at=iso(task.created_at) or "",
            closed_at=iso(task.closed_at), close_reason=task.close_reason,
            vms=[VmView.of(vm, (exposures or {}).get(vm.id)) for vm in vms],
            running_execs=running_execs,
            snapshots=[SnapshotView.of(snap) for snap in snapshots or []
                       if snap.state == "ready"])


class EventView(Output):
    id: int
    type: str
    at: str
    actor: str
    details: dict[str, Any]

    @classmethod
    def of(cls, event: Event) -> EventView:
        return cls.model_construct(id=event.id, type=event.type, at=iso(event.at) or "",
                                   actor=event.actor, details=event.details)


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

    @classmethod
    def of(cls, ex: Exec, *, stdout: bytes = b"", stderr: bytes = b"",
           stdout_offset: int | None = None, stderr_offset: int | None = None,
           truncated: bool = False, duration_ms: int | None = None) -> ExecView:
        return cls.model_construct(
            exec_id=ex.id, vm_id=ex.vm_id, command=ex.command, status=ex.status,
            exit_code=ex.exit_code, signal=ex.signal, timed_out=ex.timed_out,
            started_at=iso(ex.started_at) or "", ended_at=iso(ex.ended_at),
            duration_ms=ex.duration_ms if duration_ms is None else duration_ms,
            stdout=stdout.decode("utf-8", "replace"), stderr=stderr.decode("utf-8", "replace"),
            stdout_offset=ex.stdout_bytes if stdout_offset is None else stdout_offset,
            stderr_offset=ex.stderr_bytes if stderr_offset is None else stderr_offset,
            stdout_bytes=ex.stdout_bytes, stderr_bytes=ex.stderr_bytes, truncated=truncated)
