"""The store's repositories: one small port per aggregate, reached on the unit
of work (``tx.tasks``, ``tx.vms``, ``tx.events``, ``tx.pools``, ``tx.pool_vms``, …;
see `ports.Tx`), and two read ports across aggregates: ``tx.fleet`` (VMs across
tasks, by host, owner or status) and ``tx.rates`` (the client budgets' windows).
Where a row changes by a domain transition, its repository's ``save(new, was)``
writes what changed with one compare-and-set on what the row was.

Every method runs inside the transaction of the ``store.read()`` or
``store.write()`` block that gave the unit of work; methods that change rows
raise ``ReadOnlyTransaction`` inside ``read()``. Inserts raise ``DuplicateKey``
or ``MissingReference`` (rift.domain.store_errors) and leave the transaction
usable. Pages take a ``limit`` (never negative) and answer at most that many.
Times are timezone-aware and come back in UTC.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from rift.domain.model import (
    ApiToken,
    Event,
    Exec,
    Host,
    NewEvent,
    Task,
    User,
    Vm,
)
from rift.domain.pools import Pool, PoolVm, PoolVmState
from rift.domain.records import (
    ChangeMark,
    Exposure,
    HostUsage,
    LoginFailures,
    RateKind,
    RateWindow,
    Snapshot,
    WebSession,
)
from rift.domain.sandboxes import Sandbox


class TaskRepository(Protocol):
    """Tasks. A lease or close change is a domain transition (`Task.attached`,
    `taken_over`, `released`, `closed`) saved with `save`: one compare-and-set."""

    def add(self, task: Task) -> None: ...
    def get(self, task_id: str) -> Task | None:
        """In a write transaction the row stays locked until the commit (PostgreSQL:
        FOR UPDATE; SQLite holds the write lock), so racing writers of one task queue."""
        ...
    def find_by_key(self, owner: str, key: str) -> Task | None: ...
    def page(self, owner: str | None, status: str, limit: int, after: str | None) -> list[Task]:
        """Newest first; ``status`` is open, closed or all; ``after`` is the id of the
        last task of the previous page (naming no task: an empty page); ``owner=None``
        lists every user's (operators)."""
        ...
    def recently_closed(self, owner: str, limit: int) -> list[Task]:
        """The owner's closed tasks, the most recently closed first."""
        ...
    def count_open(self, owner: str | None) -> int:
        """Open tasks of ``owner``; of every user with None."""
        ...
    def save(self, task: Task, expected_gen: int) -> bool:
        """Compare-and-set: store ``task``'s lease state (status, secret digest,
        holder, held since, last activity, closed at, close reason) and its
        ``lease_gen`` where the row is still at ``expected_gen``. ``task.lease_gen``
        must be ``expected_gen + 1``. True when this call won."""
        ...
    def touch(self, task_id: str, now: datetime, not_after: datetime) -> bool:
        """Move ``last_activity_at`` to ``now`` where it is still at or before
        ``not_after`` and the task is open (a step has passed). No generation change."""
        ...
    def due_idle(self, cutoff: datetime, limit: int) -> list[Task]:
        """Open tasks with ``last_activity_at <= cutoff``, the quietest first: an
        indexed range scan."""
        ...
    def purge_closed_before(self, cutoff: datetime, limit: int) -> list[str]:
        """Delete closed tasks (with their VM rows and events) closed before
        ``cutoff``, the longest closed first; answers the ids deleted."""
        ...
    def shift_open(self, seconds: float) -> int:
        """Move every open task's last activity later by ``seconds``; answers how many."""
        ...


class SnapshotRepository(Protocol):
    """Snapshots (SPEC §12). A change is a domain transition (`Snapshot.made`,
    `deleting`, `removed`) saved with one compare-and-set on the state it left."""

    def add(self, snap: Snapshot) -> None: ...
    def get(self, snapshot_id: str) -> Snapshot | None: ...
    def of_task(self, task_id: str) -> list[Snapshot]:
        """Oldest first."""
        ...
    def of_tasks(self, task_ids: Sequence[str]) -> dict[str, list[Snapshot]]:
        """Every asked task id is a key (with ``[]`` when it has none)."""
        ...
    def all(self) -> list[Snapshot]: ...
    def save(self, snap: Snapshot, was: Snapshot) -> bool:
        """Compare-and-set: store what ``snap`` changed from ``was`` (a transition of
        ``was``) where the row is still in ``was.state``. True when this call won."""
        ...
    def remove(self, snap: Snapshot) -> bool:
        """Delete the row while it is still in ``snap.state`` (a `Snapshot.removed`)."""
        ...
    def bytes_by_host(self) -> dict[str, tuple[int, int]]:
        """Host name -> (how many snapshots, their bytes)."""
        ...
    def bytes_of_owner(self, owner: str) -> int:
        """The bytes of the user's snapshots."""
        ...


class ExposureRepository(Protocol):
    """Exposures (SPEC §13): one per guest port, found by its secret's digest."""

    def put(self, exposure: Exposure) -> Exposure | None:
        """Add it, replacing (and answering) the VM port's exposure before."""
        ...
    def by_digest(self, digest: str) -> Exposure | None: ...
    def of_vms(self, vm_ids: Sequence[str]) -> dict[str, list[Exposure]]:
        """Every asked VM id is a key (with ``[]`` when it has none), by port."""
        ...
    def remove(self, vm_id: str, port: int | None = None) -> list[Exposure]:
        """Delete the VM's exposure of `port` (every one when None); answers them."""
        ...
    def all(self) -> list[Exposure]: ...


class SandboxRepository(Protocol):
    """E2B sandboxes (SPEC §16): the door's settings of a VM, by its id."""

    def add(self, sandbox: Sandbox) -> None: ...
    def get(self, vm_id: str) -> Sandbox | None: ...
    def of_owner(self, owner: str) -> list[Sandbox]:
        """The user's, oldest first (by start, then VM id)."""
        ...
    def set_end(self, vm_id: str, end_at: datetime | None) -> bool: ...
    def set_traffic(self, vm_id: str, traffic_digest: str | None) -> bool: ...
    def due(self, now: datetime, limit: int) -> list[Sandbox]:
        """Those whose end is at or before ``now``, the earliest first."""
        ...
    def remove(self, vm_id: str) -> bool: ...


class ExecRepository(Protocol):
    """Execs (SPEC §10). An exec ends once (`Exec.ended`), saved with `save`: a
    compare-and-set from `running`, so one caller records its end (and writes its
    `exec_ended` event). Rows go with their task's tombstone
    (`TaskRepository.purge_closed_before`)."""

    def add(self, ex: Exec) -> None: ...
    def get(self, exec_id: str) -> Exec | None: ...
    def of_task(self, task_id: str, vm_id: str | None = None, *,
                running_only: bool = False) -> list[Exec]:
        """The task's execs (of one VM), oldest first."""
        ...
    def running(self, limit: int, after: str | None = None) -> list[Exec]:
        """Running execs of every task in id order, from the first id past `after`."""
        ...
    def count_running(self, task_ids: Sequence[str]) -> dict[str, int]:
        """Every asked task id is a key (0 when none run)."""
        ...
    def seen(self, exec_id: str, stdout_bytes: int, stderr_bytes: int) -> bool:
        """Record the output totals last seen of a running exec (never lower)."""
        ...
    def save(self, ex: Exec, was: Exec) -> bool:
        """Compare-and-set: store what ``ex`` changed from ``was`` (a transition of
        ``was``) where the row is still at ``was.status``. True when this call won."""
        ...


class VmRepository(Protocol):
    """A task's VMs. A change is a domain transition (`Vm.running`, `failed`,
    `destroyed`, `changing`, `paused`, ...) saved with `save`: one compare-and-set on
    the status and change it left. VMs read across tasks: `FleetReads`."""

    def add(self, vm: Vm) -> None: ...
    def get(self, vm_id: str, *, lock: bool = False) -> Vm | None:
        """``lock`` in a write transaction: the row stays locked until the commit
        (PostgreSQL: FOR UPDATE; SQLite holds the write lock), so a transition of what
        was read is saved against the row as it is."""
        ...
    def find_by_key(self, owner: str, key: str) -> Vm | None: ...
    def of_task(self, task_id: str) -> list[Vm]:
        """In creation order."""
        ...
    def of_tasks(self, task_ids: Sequence[str]) -> dict[str, list[Vm]]:
        """Every asked task id is a key (with ``[]`` when it has no VMs)."""
        ...
    def count_live(self, task_id: str) -> int: ...
    def save(self, vm: Vm, was: Vm) -> bool:
        """Compare-and-set: store what ``vm`` changed from ``was`` (a transition of
        ``was``) where the row is still at ``was.status`` with ``was.change`` (None:
        with none). True when this call won."""
        ...
    def record_stats(self, vm_id: str, stats: str) -> bool:
        """The usage sampler's figures (rift.domain.usage's JSON), where the VM still
        runs. Not a transition: no event, and no status or change moves."""
        ...


class FleetReads(Protocol):
    """VMs across tasks, read by host, owner or status: for reconciliation,
    placement, the sweeps, the operator's lists and /metrics (``tx.fleet``)."""

    def count_by_status(self, status: str) -> int: ...
    def live_of_closed_tasks(self, limit: int) -> list[Vm]:
        """Live VMs in tasks that have closed: what a close cut short left behind."""
        ...
    def sleep_candidates(self, default_cutoff: datetime | None, set_cutoff: datetime,
                         limit: int) -> list[Vm]:
        """What may go to sleep (SPEC §17), the quietest task's first: running VMs with
        no change under way in open tasks quiet since before ``default_cutoff`` (tasks
        with no `sleep_after_s`; None: those never sleep) or ``set_cutoff`` (tasks
        with a `sleep_after_s` above 0: each is checked against its own by the caller)."""
        ...
    def live_on_host(self, host: str) -> list[Vm]: ...
    def live_of_owner(self, owner: str) -> list[Vm]: ...
    def usage_by_host(self) -> dict[str, HostUsage]:
        """vCPUs and memory of the VMs that hold them (creating, running, or
        resuming or waking), by host name."""
        ...


class EventRepository(Protocol):
    """Each task's append-only log."""

    def add(self, event: NewEvent) -> int:
        """Append; answers the event's id (increasing)."""
        ...
    def page(self, task_id: str, after_id: int, limit: int) -> list[Event]:
        """The task's events with ids above ``after_id``, oldest first."""
        ...
    def of_type(self, task_ids: Sequence[str], event_type: str,
                since: datetime | None = None) -> list[Event]:
        """The asked tasks' events of one type (at or after `since`), oldest first."""
        ...


class RateWindows(Protocol):
    """The client budgets' counts (SPEC §15, ``tx.rates``)."""

    def window(self, kind: RateKind, key: str, since: datetime) -> RateWindow:
        """How many rows of ``kind`` ``key`` made at or after ``since``, and the
        oldest's time, in one read: tasks, VMs (created) and execs (started) by their
        owner; `stale_rejected` events by their task's id."""
        ...


class UserRepository(Protocol):
    def add(self, user: User) -> None: ...
    def get(self, name: str) -> User | None: ...
    def all(self) -> list[User]:
        """By name."""
        ...
    def count(self) -> int: ...


class TokenRepository(Protocol):
    def add(self, token: ApiToken) -> None: ...
    def get(self, token_id: str) -> ApiToken | None: ...
    def by_digest(self, digest: str) -> ApiToken | None: ...
    def of_user(self, user: str) -> list[ApiToken]:
        """Oldest first."""
        ...
    def revoke(self, token_id: str, at: datetime) -> bool:
        """True when this call revoked it; False when missing or already revoked."""
        ...


class HostRepository(Protocol):
    """Hosts. A change is a domain transition (`Host.resized`, `set_drain`,
    `unreachable`, `reachable`) saved with `save`: one compare-and-set on the columns
    it moves."""

    def add(self, host: Host) -> None: ...
    def get(self, name: str, *, lock: bool = False) -> Host | None:
        """``lock`` in a write transaction: the row stays locked until the commit
        (PostgreSQL: FOR UPDATE; SQLite holds the write lock), so a transition of what
        was read is saved against the row as it is."""
        ...
    def all(self) -> list[Host]:
        """By name."""
        ...
    def save(self, host: Host, was: Host) -> bool:
        """Compare-and-set: store what ``host`` changed from ``was`` (a transition of
        ``was``) where each column it changes is still as in ``was``. True when this
        call won (with no change: while the host is there)."""
        ...
    def delete(self, name: str) -> bool: ...


class MetaRepository(Protocol):
    """Installation facts (its id, the heartbeat)."""

    def get(self, key: str) -> str | None: ...
    def swap(self, key: str, expected: str | None, value: str) -> bool:
        """Compare-and-set: ``key`` becomes ``value`` where it is ``expected`` (None: absent)."""
        ...


class WebRepository(Protocol):
    """What the Boxes page keeps: sessions, failed-login counts, the change mark."""

    def add_session(self, session: WebSession) -> None: ...
    def get_session(self, digest: str) -> WebSession | None: ...
    def delete_session(self, digest: str) -> bool: ...
    def purge_sessions(self, before: datetime) -> int:
        """Delete sessions that expired at or before ``before``; answers how many."""
        ...
    def login_failures(self, key: str) -> LoginFailures | None: ...
    def add_login_failure(self, key: str, at: datetime) -> int:
        """Count one more failure under ``key`` (at ``at``); answers the new count."""
        ...
    def uncount_login_failure(self, key: str) -> None:
        """Take back one failure counted under ``key`` before its password was
        checked (the check passed, or never ran)."""
        ...
    def clear_login_failures(self, key: str) -> None: ...
    def purge_login_failures(self, before: datetime) -> int:
        """Forget counts whose last failure is older than ``before``."""
        ...
    def change_mark(self) -> ChangeMark:
        """The newest event id and the latest activity of any open task: one
        cheap, indexed read that the page's live stream polls."""
        ...


class PoolRepository(Protocol):
    """Pools (their VMs: `PoolVmRepository`). A change is a domain transition
    (`Pool.resized`, `fill_claimed`, `start_failed`, ...) saved with `save`: one
    compare-and-set on the columns it moves, so of two replicas claiming one pool's
    fill one holds it."""

    def add(self, pool: Pool) -> None: ...
    def get(self, pool_id: str, *, lock: bool = False) -> Pool | None:
        """``lock`` in a write transaction: the row stays locked until the commit
        (PostgreSQL: FOR UPDATE; SQLite holds the write lock), so a transition of what
        was read is saved against the row as it is."""
        ...
    def find(self, image: str, host: str | None, vcpus: int, memory_mib: int) -> Pool | None: ...
    def all(self) -> list[Pool]:
        """By image, then size."""
        ...
    def save(self, pool: Pool, was: Pool) -> bool:
        """Compare-and-set: store what ``pool`` changed from ``was`` (a transition of
        ``was``) where each column it changes is still as in ``was``. True when this
        call won (with no change: while the pool is there)."""
        ...
    def delete(self, pool_id: str) -> bool:
        """The pool's row; its VMs' rows must be gone first."""
        ...


class PoolVmRepository(Protocol):
    """Pooled VMs (``tx.pool_vms``). A change is a domain transition
    (`PoolVm.saving`, `settled`, `destroying`) saved with `save`, one compare-and-set
    on the state it left; a hand-out (`handed_out`) or a removal (`removed`) is
    `take`: it deletes the row only where it is still in the state it was seen in,
    so one VM goes to one caller."""

    def add(self, vm: PoolVm) -> None: ...
    def get(self, vm_id: str, *, lock: bool = False) -> PoolVm | None:
        """``lock`` in a write transaction: the row stays locked until the commit
        (PostgreSQL: FOR UPDATE; SQLite holds the write lock), so a transition of what
        was read is saved against the row as it is."""
        ...
    def all(self, pool_id: str | None = None) -> list[PoolVm]:
        """Every pool VM (of one pool), oldest first."""
        ...
    def ids(self) -> set[str]:
        """The ids of every pool VM: reconciliation keeps their domains and files."""
        ...
    def candidates(self, image: str, vcpus: int, memory_mib: int,
                   states: Sequence[PoolVmState]) -> list[PoolVm]:
        """Pool VMs of that image and size in one of ``states``, oldest first."""
        ...
    def save(self, vm: PoolVm, was: PoolVm) -> bool:
        """Compare-and-set: store what ``vm`` changed from ``was`` (a transition of
        ``was``) where the row is still in ``was.state``. True when this call won."""
        ...
    def take(self, vm: PoolVm) -> bool:
        """Delete the pool VM's row where it is still in ``vm.state`` (a
        `PoolVm.handed_out` or `removed`): True when this call took it (a racing
        caller gets False)."""
        ...
    def usage_by_host(self) -> dict[str, HostUsage]:
        """vCPUs and memory that pool VMs hold (those not saved), by host name."""
        ...
