"""The nouns of SPEC §1 as plain values. The store reads and writes these.

A task, a VM, an exec and a host change only by their methods (transitions): each
answers the object as it is after the change and the event that records it (where
one does), and refuses a state it does not start from (a task with
`TaskClosed`/`TaskReleased`, the others with `IllegalTransition`). The store saves the
answer in one transaction with its event, by one compare-and-set: a task on its
lease generation (``tx.tasks.save(new, expected_gen=old.lease_gen)``), a VM on the
status and change it was read in (``tx.vms.save(new, was=old)``: ``UPDATE vms ...
WHERE id = ? AND status = ? AND change IS ?``).

Why no version column for VMs (and no migration): every transition below reads
and moves the status or the change, so (status, change) is the version; the
columns no transition reads (`stats`, the usage sampler's, with its own
conditional write `tx.vms.record_stats`; `error`'s notes) would only make a
version column move under changes that need not conflict. A transition allowed
from several states whose row may have moved since it was read (a destroy, a
note) is made on the row read locked in the same transaction
(``tx.vms.get(id, lock=True)``), so it is saved against the row as it is.

A VM (SPEC §1, §3, §11, §12, §14; `change` is a pause, resume, snapshot or move
under way, recorded before libvirt is asked)::

    from (status, change)         method                      to                     event
    (none)                        -                           creating               vm_creating
    creating                      running((kind, ms), ...)    running                vm_running
    creating|running|paused, any  failed(error, ...)          failed                 vm_failed
    any but destroyed             destroy_requested(now)      (same, destroy asked)  -
    any but destroyed             destroyed(...)              destroyed              vm_destroyed
    running, none                 changing("pausing", now)    running, pausing       -
    running, none                 changing("snapshotting", ..) running, snapshotting -
    paused, none                  changing("resuming", now)   paused, resuming       -
    running, none                 changing("falling_asleep",.) running, falling_asleep -
    sleeping, none                changing("waking", now)     sleeping, waking       -
    running, none                 changing("moving", now)     running, moving        -
    running, pausing              paused(...)                 paused, none           vm_paused
    sleeping, none                paused(...)                 paused, none           vm_paused
    running, falling_asleep       slept(...)                  sleeping, none         vm_slept
    sleeping, waking              woke(ms, ...)               running, none          vm_woke
    paused, resuming|none         resumed(...)                running, none          vm_resumed
    any, any change               change_ended()              (same status), none    -
    running, none|moving          moved((host, port), ...)    running on host, none  vm_moved
    creating|running|paused|sleeping, any  noted(error | None)  (same, error noted)  -

(`failed` and `noted` take every live status: creating, running, paused, sleeping.)

(`resumed` from paused with none under way: its domain was started outside Rift.
A sleeping VM (SPEC §17) is saved like a paused one, by Rift rather than its agent:
`paused` from sleeping is a pause that needs no save; `woke` records how long the
wake took, the view's `woke: {ms}`.
`change_ended`: a change libvirt refused or a crash cut short, rolled back; or a
snapshot's save done. `moving`: a live migration under way (`rift host drain
--move`): the VM still runs and takes execs, files and exposures meanwhile, but no
sweep fails, frees or destroys it while it is recent (rift.services.lifecycle.teardown.
in_move).)

An exec (SPEC §10) ends once; saved on its status (``tx.execs.save(new, was=old)``:
``... WHERE id = ? AND status = 'running'``), so one caller records its end and its
event (the guest's output totals, which `tx.execs.seen` moves meanwhile, are no
part of the check)::

    from       method                 to                              event
    (none)     -                      running                         exec_started
    running    ended(ExecEnd, ...)    exited|killed|timed_out|lost    exec_ended

A host (its state as `rift host list` shows it: active, drained, unreachable)
changes with no event; saved on each column the change moves, as it was read
(``tx.hosts.save(new, was=old)``)::

    from               method                           to
    (none)             -                                active
    any                resized(uri, vcpus, memory_mib)  (same state) on that URI, of that size
    any                set_drain(drained)               drained, or not
    answering          unreachable(now, error)          unreachable since now, error kept
    unreachable        reachable()                      answering, no error
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from rift.domain.clock import iso
from rift.domain.errors import IllegalTransition, TaskClosed, TaskReleased, check_from

TaskStatus = Literal["open", "closed"]
CloseReason = Literal["closed", "idle", "operator"]
# When a quiet task's VMs sleep (SPEC §17): `idle`, when no exec runs in them;
# `always`, even with execs running.
SleepMode = Literal["idle", "always"]
VmStatus = Literal["creating", "running", "paused", "sleeping", "failed", "destroyed"]
# A live VM is the task's: it counts against the task's VMs, keeps its SSH port and
# goes when the task closes. A paused or sleeping one holds only its disk and saved
# memory.
LIVE_VM_STATUSES: tuple[VmStatus, ...] = ("creating", "running", "paused", "sleeping")
# What holds vCPUs and memory on a host (with a VM whose resume or wake is under way).
HOLDING_VM_STATUSES: tuple[VmStatus, ...] = ("creating", "running")
# A change of a VM's state under way (SPEC §12, §17), recorded before libvirt is
# asked, so reconciliation finishes or rolls back one that a crash cut short.
VmChange = Literal["pausing", "resuming", "snapshotting", "falling_asleep", "waking",
                   "moving"]
# The changes toward a running VM that hold its vCPUs and memory already.
STARTING_VM_CHANGES: tuple[VmChange, ...] = ("resuming", "waking")
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
EXEC_END_STATUSES: tuple[ExecStatus, ...] = ("exited", "killed", "timed_out", "lost")
DEFAULT_DISK_GIB = 10  # SPEC §3's `disk_gib` default: the size of a VM's overlay


def default_memory_mib(image: str) -> int:
    """SPEC §3: `memory_mib` defaults to 256, and to 512 for `debian` (VMs and pools)."""
    return 512 if image == "debian" else 256

EVENT_TYPES = (
    "opened", "attached", "taken_over", "released", "closed",
    "vm_creating", "vm_running", "vm_failed", "vm_destroyed", "stale_rejected",
    "vm_paused", "vm_resumed", "snapshot_made", "snapshot_deleted", "vm_slept", "vm_woke",
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
    # SPEC §17: quiet this long, its running VMs sleep (None: RIFT_TASK_SLEEP_S; 0:
    # never); `always` puts them to sleep with execs running, `idle` only without.
    sleep_after_s: int | None = None
    sleep: SleepMode = "idle"

    @property
    def is_open(self) -> bool:
        return self.status == "open"

    @property
    def is_held(self) -> bool:
        return self.status == "open" and self.secret_digest is not None

    def sleeps_after_s(self, default: int) -> int:
        """Its sleep time: its own, else `default` (RIFT_TASK_SLEEP_S); 0 never."""
        return default if self.sleep_after_s is None else self.sleep_after_s

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
    # How long its last wake took from the call that woke it (SPEC §17's `woke`).
    woke_ms: int | None = None

    @property
    def domain_name(self) -> str:
        return f"rift-{self.id}"

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_VM_STATUSES

    @property
    def keeps_execs(self) -> bool:
        """Its guest still holds its execs: running, or paused or asleep with them saved."""
        return (self.status in ("running", "paused", "sleeping")
                and self.destroy_requested_at is None)

    # Its transitions: the table in this module's docstring. `by` is the actor of
    # the event, `details` more of the event's details.

    def running(self, start: tuple[StartKind, int], by: str, now: datetime,
                details: Mapping[str, Any] | None = None) -> tuple[Vm, NewEvent]:
        """It answers: `start` is how it came to run and in how many milliseconds."""
        self._from("running", ("creating",))
        kind, start_ms = start
        new = replace(self, status="running", ready_at=now, start_kind=kind, start_ms=start_ms)
        return new, self._event("vm_running", by, now, {
            "start_kind": kind, "start_ms": start_ms, **(details or {})})

    def failed(self, error: str, by: str, now: datetime) -> tuple[Vm, NewEvent]:
        """It did not come to run, or its domain was lost (a change under way stays
        recorded: reconciliation reads it)."""
        self._from("failed", LIVE_VM_STATUSES)
        return (replace(self, status="failed", error=error),
                self._event("vm_failed", by, now, {"error": error}))

    def destroy_requested(self, now: datetime) -> Vm:
        """Its destroy is asked for, before libvirt is (the first time is kept)."""
        self._from("destroy requested", DESTROYABLE_VM_STATUSES)
        if self.destroy_requested_at is not None:
            return self
        return replace(self, destroy_requested_at=now)

    def destroyed(self, by: str, now: datetime,
                  details: Mapping[str, Any] | None = None) -> tuple[Vm, NewEvent]:
        """Its domain is gone."""
        self._from("destroyed", DESTROYABLE_VM_STATUSES)
        return (replace(self, status="destroyed", destroyed_at=now),
                self._event("vm_destroyed", by, now, {"host": self.host, **(details or {})}))

    def changing(self, change: VmChange, now: datetime) -> Vm:
        """A pause, resume, snapshot, sleep, wake or move begins: recorded before
        libvirt is asked."""
        source: VmStatus = ("paused" if change == "resuming" else
                            "sleeping" if change == "waking" else "running")
        self._from(change, (source,), changes=(None,))
        return replace(self, change=change, change_at=now)

    def paused(self, by: str, now: datetime,
               details: Mapping[str, Any] | None = None) -> tuple[Vm, NewEvent]:
        """Its pause is done: its memory is saved, its domain stopped (a sleeping VM's
        is already: its pause needs no save)."""
        if self.status == "sleeping":
            self._from("paused", ("sleeping",), changes=(None,))
        else:
            self._from("paused", ("running",), changes=("pausing",))
        return (replace(self, status="paused", change=None, change_at=None),
                self._event("vm_paused", by, now, dict(details or {})))

    def resumed(self, by: str, now: datetime,
                details: Mapping[str, Any] | None = None) -> tuple[Vm, NewEvent]:
        """It runs again: its resume is done, or its domain was started outside Rift."""
        self._from("resumed", ("paused",), changes=("resuming", None))
        return (replace(self, status="running", change=None, change_at=None),
                self._event("vm_resumed", by, now, dict(details or {})))

    def slept(self, by: str, now: datetime,
              details: Mapping[str, Any] | None = None) -> tuple[Vm, NewEvent]:
        """It went to sleep (SPEC §17): its memory is saved, its domain stopped."""
        self._from("slept", ("running",), changes=("falling_asleep",))
        return (replace(self, status="sleeping", change=None, change_at=None),
                self._event("vm_slept", by, now, dict(details or {})))

    def woke(self, ms: int, by: str, now: datetime,
             details: Mapping[str, Any] | None = None) -> tuple[Vm, NewEvent]:
        """It runs again after a sleep, its guest answering `ms` after the call that
        woke it began."""
        self._from("woke", ("sleeping",), changes=("waking",))
        return (replace(self, status="running", change=None, change_at=None, woke_ms=ms),
                self._event("vm_woke", by, now, {"ms": ms, **(details or {})}))

    def change_ended(self) -> Vm:
        """The change under way ends with no new status: rolled back, or a snapshot saved."""
        self._from("change ended", (*LIVE_VM_STATUSES,),
                   changes=("pausing", "resuming", "snapshotting", "falling_asleep", "waking",
                            "moving"))
        return replace(self, change=None, change_at=None)

    def moved(self, to: tuple[str, int], by: str, now: datetime,
              details: Mapping[str, Any] | None = None) -> tuple[Vm, NewEvent]:
        """Live-migrated: `to` is its new host and the SSH port it is reached on there;
        the move under way, if recorded, ends."""
        self._from("moved", ("running",), changes=(None, "moving"))
        host, ssh_port = to
        return replace(self, host=host, ssh_port=ssh_port, change=None,
                       change_at=None), self._event("vm_moved", by, now, {
            "from": self.host, "to": host, "ssh_port": ssh_port, **(details or {})})

    def noted(self, error: str | None) -> Vm:
        """Its `error` says why it may not answer (its host is silent), or no longer."""
        self._from("noted", LIVE_VM_STATUSES)
        return replace(self, error=error)

    def _from(self, transition: str, statuses: tuple[VmStatus, ...],
              changes: tuple[VmChange | None, ...] | None = None) -> None:
        if self.status not in statuses or (changes is not None and self.change not in changes):
            state = self.status if self.change is None else f"{self.status} ({self.change})"
            raise IllegalTransition("VM", self.id, state, transition)

    def _event(self, kind: str, by: str, now: datetime,
               details: dict[str, Any]) -> NewEvent:
        return NewEvent(self.task_id, kind, now, by, {"vm_id": self.id, **details})


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

    def ended(self, end: ExecEnd, by: str, now: datetime) -> tuple[Exec, NewEvent]:
        """It ended as ``end`` says (the table in this module's docstring)."""
        check_from("exec", self.id, self.status, ("running",), "ended")
        out, err = end.totals if end.totals is not None else (self.stdout_bytes,
                                                                self.stderr_bytes)
        new = replace(self, status=end.status, ended_at=end.at, exit_code=end.exit_code,
                      signal=end.signal, timed_out=end.timed_out,
                      duration_ms=end.duration_ms, stdout_bytes=out, stderr_bytes=err)
        return new, NewEvent(self.task_id, "exec_ended", now, by, {
            "exec_id": self.id, "vm_id": self.vm_id, "status": end.status,
            "exit_code": end.exit_code})


@dataclass(frozen=True)
class ExecEnd:
    """How an exec ended and when; what its guest said of it where it did (its exit
    code or signal, how long it ran, whether its timeout ended it, its output totals:
    None keeps the totals last seen)."""

    status: ExecStatus
    at: datetime
    exit_code: int | None = None
    signal: str | None = None
    duration_ms: int | None = None
    timed_out: bool = False
    totals: tuple[int, int] | None = None  # stdout and stderr bytes

    def __post_init__(self) -> None:
        if self.status not in EXEC_END_STATUSES:
            raise ValueError(f"an exec ends exited, killed, timed_out or lost, not "
                             f"{self.status!r}")


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

    @property
    def state(self) -> str:
        """active, drained or unreachable (`rift host list`)."""
        return ("unreachable" if self.unreachable_since is not None else
                "drained" if self.drained else "active")

    # Its transitions: the table in this module's docstring.

    def resized(self, uri: str, vcpus: int, memory_mib: int) -> Host:
        """Its connection and size as configured (`local`'s, taken up at start)."""
        return replace(self, uri=uri, vcpus=vcpus, memory_mib=memory_mib)

    def set_drain(self, drained: bool) -> Host:
        """Drained (it takes no new VMs) or not; asked again, it stays so."""
        return replace(self, drained=drained)

    def unreachable(self, now: datetime, error: str) -> Host:
        """It stopped answering (at ``now``; ``error`` says how): it takes no new VMs."""
        check_from("host", self.name, self.state, ("active", "drained"), "unreachable")
        return replace(self, unreachable_since=now, last_error=error)

    def reachable(self) -> Host:
        """It answers again."""
        check_from("host", self.name, self.state, ("unreachable",), "reachable")
        return replace(self, unreachable_since=None, last_error=None)
