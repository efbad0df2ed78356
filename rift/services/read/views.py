"""The read side (DESIGN 21): every view of SPEC §3, §10, §12 and §13 is built here,
from what it shows, and only here. Services answer ids and states (a `Task`, a
`Vm`, an `Exec` and what its guest said); the use cases hand those to these
builders for their answers. Built from the store's values without a second
validation (`model_construct`); the doors' output schemas are checked against
them in the tests.

A new sub-resource of a VM (volumes, code contexts) is read here: its view, and
its part of the VM's view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rift.contract.builds import BuildView, ImageView
from rift.contract.views import (
    AllowView,
    EventView,
    ExecView,
    ExposureView,
    KeptVolumeView,
    PortView,
    SnapshotView,
    SshView,
    StartView,
    StatsView,
    TaskView,
    VmCodeContextView,
    VmView,
    VolumeAttachmentView,
    VolumeMountView,
    VolumeView,
    WokeView,
)
from rift.domain import egress as egress_rules
from rift.domain import usage
from rift.domain.builds import Build, OwnedImage
from rift.domain.clock import iso
from rift.domain.code_contexts import CodeContext
from rift.domain.model import Event, Exec, Host, Task, Vm
from rift.domain.records import Exposure, Snapshot
from rift.domain.volumes import Attachment, KeptVolume, Volume
from rift.services.context import Deps
from rift.services.ports import Tx

# -- VMs ---------------------------------------------------------------------------------


def _stats(stats: str | None) -> StatsView | None:
    now = usage.view(stats)
    return StatsView.model_construct(**now) if now is not None else None


def _egress(egress: str) -> Literal["open", "none"] | AllowView:
    listed = egress_rules.entries(egress)
    if listed is None:
        return "none" if egress == "none" else "open"
    return AllowView.model_construct(allow=listed)


def vm_of(vm: Vm, exposures: Sequence[Exposure] = (), volumes: Sequence[Attachment] = (),
          contexts: Sequence[CodeContext] = ()) -> VmView:
    """The VM as it is, with its exposed ports (never their URLs), its volumes and
    its code contexts."""
    reachable = vm.status == "running" and vm.ssh_port is not None
    return VmView.model_construct(
        id=vm.id, task_id=vm.task_id, name=vm.name, image=vm.image, status=vm.status,
        host=vm.host, vcpus=vm.vcpus, memory_mib=vm.memory_mib, disk_gib=vm.disk_gib,
        ssh=SshView.model_construct(host=vm.ssh_host, port=vm.ssh_port)
        if reachable and vm.ssh_port is not None else None,
        created_at=iso(vm.created_at) or "", ready_at=iso(vm.ready_at),
        destroyed_at=iso(vm.destroyed_at), error=vm.error,
        start=StartView.model_construct(kind=vm.start_kind, ms=vm.start_ms)
        if vm.start_kind is not None and vm.start_ms is not None else None,
        woke=WokeView.model_construct(ms=vm.woke_ms) if vm.woke_ms is not None else None,
        egress=_egress(vm.egress),
        exposures=[PortView.model_construct(port=e.port, created_at=iso(e.created_at) or "")
                   for e in exposures],
        volumes=[VolumeMountView.model_construct(volume_id=a.volume_id, path=a.path,
                                                 read_only=a.read_only) for a in volumes],
        code_contexts=[code_context(x) for x in contexts],
        stats=_stats(vm.stats) if vm.status == "running" else None)


def vm(tx: Tx, row: Vm) -> VmView:
    """A VM's view, read in `tx` with its exposed ports, its volumes and contexts."""
    return vm_of(row, tx.exposures.of_vms([row.id])[row.id], tx.volumes.of_vms([row.id])[row.id],
                 tx.code_contexts.of_vms([row.id])[row.id])


def code_context(row: CodeContext) -> VmCodeContextView:
    """A code context as the VM's view shows it (SPEC §20): its last run, the one in
    flight."""
    return VmCodeContextView.model_construct(
        id=row.id, language=row.language, cwd=row.cwd, last_run_at=iso(row.last_run_at),
        last_status=row.last_status, execution_count=row.execution_count, running=row.run_id)


def volume(row: Volume, holders: Sequence[Attachment] = (), host: Host | None = None
           ) -> VolumeView:
    """A volume with where it is attached, and whether its host answers."""
    return VolumeView.model_construct(
        id=row.id, name=row.name, size_gib=row.size_gib, host=row.host,
        created_at=iso(row.created_at) or "", parent_id=row.parent_id,
        used_bytes=row.used_bytes,
        host_unreachable_since=iso(host.unreachable_since) if host is not None else None,
        attached_to=[VolumeAttachmentView.model_construct(
            vm_id=a.vm_id, task_id=a.task_id, path=a.path, read_only=a.read_only)
            for a in holders])


def volume_now(tx: Tx, row: Volume) -> VolumeView:
    """A volume's view read in `tx`: its attachments and its host's state."""
    return volume(row, tx.volumes.holders(row.id), tx.hosts.get(row.host))


def exposure(made: Exposure, url: str) -> ExposureView:
    """An exposure as `rift_vm_expose` answers it: the only time its URL is shown."""
    return ExposureView.model_construct(vm_id=made.vm_id, port=made.port, url=url,
                                        created_at=iso(made.created_at) or "")


def snapshot(snap: Snapshot, kept: Sequence[KeptVolume] = ()) -> SnapshotView:
    """A snapshot with the volumes it keeps (`kept_volumes`)."""
    return SnapshotView.model_construct(
        id=snap.id, task_id=snap.task_id, vm_id=snap.vm_id, name=snap.name,
        created_at=iso(snap.created_at) or "", bytes=snap.bytes,
        volumes=[KeptVolumeView.model_construct(
            volume_id=k.volume_id, path=k.path, read_only=k.read_only, size_gib=k.size_gib,
            forks_attach=k.forks_attach) for k in kept])


def kept_volumes(tx: Tx, snaps: Sequence[Snapshot]) -> dict[str, list[KeptVolume]]:
    """Snapshot id -> the volumes it keeps, as its `snapshot_made` event lists them
    (one read for all; none without a ready snapshot)."""
    ready = [s for s in snaps if s.state == "ready"]
    if not ready:
        return {}
    made = tx.events.of_type(sorted({s.task_id for s in ready}), "snapshot_made",
                             since=min(s.created_at for s in ready))
    return {str(e.details.get("snapshot_id")): KeptVolume.listed(e.details) for e in made}


def snapshot_now(tx: Tx, snap: Snapshot) -> SnapshotView:
    """A snapshot's view, read in `tx` with the volumes it keeps."""
    return snapshot(snap, kept_volumes(tx, [snap]).get(snap.id, ()))


# -- tasks -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskParts:
    """What a task's view shows besides the task: its VMs (with their exposures),
    its running execs and its snapshots."""

    vms: Sequence[Vm] = ()
    running_execs: int = 0
    snapshots: Sequence[Snapshot] = ()
    exposures: dict[str, list[Exposure]] | None = None
    volumes: dict[str, list[Attachment]] | None = None
    contexts: dict[str, list[CodeContext]] | None = None
    kept: dict[str, list[KeptVolume]] | None = None  # by snapshot (kept_volumes)


def task_of(deps: Deps, task: Task, parts: TaskParts | None = None) -> TaskView:
    rules, held = deps.lease_rules, task.is_held
    have = parts or TaskParts()
    exposed, mounted, contexts = have.exposures or {}, have.volumes or {}, have.contexts or {}
    kept = have.kept or {}
    return TaskView.model_construct(
        id=task.id, name=task.name, owner=task.owner, status=task.status,
        holder=task.holder if held else None,
        held_since=iso(task.held_since) if held else None,
        last_activity_at=iso(task.last_activity_at) or "",
        lease_quiet_at=iso(rules.lease_quiet_at(task)) if held else None,
        closes_at=iso(rules.closes_at(task)), created_at=iso(task.created_at) or "",
        closed_at=iso(task.closed_at), close_reason=task.close_reason,
        sleep_after_s=task.sleeps_after_s(deps.limits.task_sleep_s), sleep=task.sleep,
        vms=[vm_of(v, exposed.get(v.id, ()), mounted.get(v.id, ()), contexts.get(v.id, ()))
             for v in have.vms],
        running_execs=have.running_execs,
        snapshots=[snapshot(s, kept.get(s.id, ())) for s in have.snapshots
                   if s.state == "ready"])


def task(deps: Deps, tx: Tx, row: Task) -> TaskView:
    """A task's view, read in `tx`."""
    found = tx.vms.of_task(row.id)
    vm_ids = [v.id for v in found]
    snaps = tx.snapshots.of_task(row.id)
    return task_of(deps, row, TaskParts(
        found, tx.execs.count_running([row.id])[row.id], snaps,
        tx.exposures.of_vms(vm_ids), tx.volumes.of_vms(vm_ids), tx.code_contexts.of_vms(vm_ids),
        kept=kept_volumes(tx, snaps)))


def task_now(deps: Deps, task_id: str) -> TaskView:
    """A task's view as it is now."""
    with deps.store.read() as tx:
        row = tx.tasks.get(task_id)
        assert row is not None
        return task(deps, tx, row)


def tasks(deps: Deps, tx: Tx, page: Sequence[Task], *, open_parts: bool = True,
          ) -> list[TaskView]:
    """Tasks' views, read in `tx` in one query per part (`open_parts` False: only
    their VMs, as the Boxes page shows closed tasks)."""
    ids = [t.id for t in page]
    found = tx.vms.of_tasks(ids)
    if not open_parts:
        return [task_of(deps, t, TaskParts(found.get(t.id, []))) for t in page]
    running = tx.execs.count_running(ids)
    snaps = tx.snapshots.of_tasks(ids)
    vm_ids = [v.id for t in page for v in found.get(t.id, [])]
    exposed, mounted = tx.exposures.of_vms(vm_ids), tx.volumes.of_vms(vm_ids)
    contexts = tx.code_contexts.of_vms(vm_ids)
    kept = kept_volumes(tx, [s for t in page for s in snaps[t.id]])
    return [task_of(deps, t, TaskParts(found.get(t.id, []), running[t.id], snaps[t.id],
                                       exposed, mounted, contexts, kept=kept)) for t in page]


def event(row: Event) -> EventView:
    return EventView.model_construct(id=row.id, type=row.type, at=iso(row.at) or "",
                                     actor=row.actor, details=row.details)


# -- execs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Output:
    """What one answer carries of an exec's streams: the bytes read, where the next
    read starts (None: after all the exec wrote), whether the read started past
    what the guest still keeps, and its duration so far."""

    stdout: bytes = b""
    stderr: bytes = b""
    stdout_offset: int | None = None
    stderr_offset: int | None = None
    truncated: bool = False
    duration_ms: int | None = None


def execution(ex: Exec, out: Output | None = None) -> ExecView:
    """An exec's view: as recorded, with `out` of its streams (none in lists)."""
    got = out or Output()
    return ExecView.model_construct(
        exec_id=ex.id, vm_id=ex.vm_id, command=ex.command, status=ex.status,
        exit_code=ex.exit_code, signal=ex.signal, timed_out=ex.timed_out,
        started_at=iso(ex.started_at) or "", ended_at=iso(ex.ended_at),
        duration_ms=ex.duration_ms if got.duration_ms is None else got.duration_ms,
        stdout=got.stdout.decode("utf-8", "replace"),
        stderr=got.stderr.decode("utf-8", "replace"),
        stdout_offset=ex.stdout_bytes if got.stdout_offset is None else got.stdout_offset,
        stderr_offset=ex.stderr_bytes if got.stderr_offset is None else got.stderr_offset,
        stdout_bytes=ex.stdout_bytes, stderr_bytes=ex.stderr_bytes, truncated=got.truncated)


# -- builds (SPEC §19) -------------------------------------------------------------------

def build(row: Build, log_from: int = 0) -> BuildView:
    log = row.log[log_from:] if log_from < len(row.log) else ""
    return BuildView.model_construct(
        build_id=row.id, image=row.image, owner=row.owner, state=row.state, steps=row.steps,
        cached=row.cached, created_at=iso(row.created_at) or "", ended_at=iso(row.ended_at),
        error=row.error, log=log, log_offset=max(log_from, len(row.log)))


def image(row: OwnedImage) -> ImageView:
    return ImageView.model_construct(name=row.name, owner=row.owner, published=row.published,
                                     build_id=row.build_id)
