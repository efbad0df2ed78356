"""Pools of ready VMs (SPEC §11): a pool, what an operator asked for and how its
filling goes, and its pooled VMs. Both change only by their methods: each answers
the object as it is after the change, and refuses a state the change does not
start from with `IllegalTransition`. The store saves the answer with one
compare-and-set (``tx.pools.save(new, was=old)``, ``tx.pool_vms.save(new,
was=old)``), so of two callers changing one row one wins: a pooled VM's on the
state it was read in (``UPDATE ... WHERE id = ? AND state = ?``); a pool, which
has no state column, on each column the change moves, as it was read (a fill's
claim on its filler and time, an operator's resize on the goal and back-off it
replaces). A pooled VM that goes (handed out or removed) is deleted the same way
(``tx.pool_vms.take(vm)``). No version column: what a change reads and moves is
the version.

A pool::

    from                          method                     to
    (none)                        -                          running/saved as set, no filler
    any                           resized(running, saved)    that goal, back-off cleared
    any                           emptied()                  goal 0/0 (its VMs go, then its row)
    free for `filler` at `now`    fill_claimed(filler, ..)   filled by `filler` until `until`
    any                           fill_released()            no filler
    any                           start_failed(error, now)   one more failure, retry after back-off
    any                           start_done()               no failures, no back-off, no error
    any                           noted(error)               `last_error` says why it waits

(Free for a filler: no one fills it, that filler does, or the last claim ran out.)

A pooled VM::

    from         method             to           by
    (none)       -                  starting     pools' fill: the row, then its domain boots
    starting     saving(key)        saving       a `saved` pool's VM answers: libvirt saves it
    starting     settled(key, now)  ready        a `running` pool's VM answers
    saving       settled(key, now)  saved        its memory is on disk
    ready        handed_out()       (row goes)   a new VM takes it (a VM row of its id)
    saved        handed_out()       (row goes)   a new VM restores it
    any          destroying()       destroying   cleared, replaced, failed: its domain goes
    starting     removed()          (row goes)   its domain was never defined
    saving       removed()          (row goes)   (as starting)
    destroying   removed()          (row goes)   its domain and files are gone

(`settled` from `starting` to `saved` and from `saving` to `ready` follow the
pool's goal too: the state it ends in is the goal's end.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from rift.domain.errors import IllegalTransition, check_from

PoolGoal = Literal["running", "saved"]
# starting: its domain boots; ready: it runs and answers (a running pool's end);
# saving: libvirt saves it; saved: its memory is on disk, its domain stopped;
# destroying: its domain is being taken down (the row goes after it).
PoolVmState = Literal["starting", "ready", "saving", "saved", "destroying"]
# Pool VMs that hold vCPUs and memory on their host (a saved one holds only disk).
POOL_RUNNING_STATES: tuple[PoolVmState, ...] = ("starting", "ready", "saving", "destroying")
BACKOFF_S = (5, 15, 60, 300)  # after the 1st, 2nd, 3rd, later failed start in a row
ERROR_CHARS = 500  # a pool's `last_error` keeps this much of the error


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

    # Its transitions: the first table in this module's docstring.

    def resized(self, running: int, saved: int) -> Pool:
        """An operator's goal (`rift pool set`): its back-off starts over."""
        return replace(self, running=running, saved=saved, failures=0, retry_at=None,
                       last_error=None)

    def emptied(self) -> Pool:
        """`rift pool clear`: no VM is wanted any more (its VMs go, then its row)."""
        return replace(self, running=0, saved=0)

    def free_for(self, filler: str, now: datetime) -> bool:
        """No one fills it, ``filler`` does, or the last claim ran out before ``now``."""
        return (self.filler is None or self.filler == filler
                or (self.fill_until is not None and self.fill_until < now))

    def fill_claimed(self, filler: str, now: datetime, until: datetime) -> Pool:
        """``filler`` fills it until ``until`` (one replica at a time)."""
        if not self.free_for(filler, now):
            raise IllegalTransition("pool", self.id, f"filled by {self.filler}", "claimed")
        return replace(self, filler=filler, fill_until=until)

    def fill_released(self) -> Pool:
        """Its fill pass is over: any replica may claim it."""
        return replace(self, filler=None, fill_until=None)

    def start_failed(self, error: str, now: datetime) -> Pool:
        """A VM of it did not start: one more failure in a row, and no start is tried
        before the back-off (`BACKOFF_S`) is over."""
        failures = self.failures + 1
        wait_s = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
        return replace(self, failures=failures, last_error=error[:ERROR_CHARS],
                       retry_at=now + timedelta(seconds=wait_s))

    def start_done(self) -> Pool:
        """A VM of it started: the back-off and the error are over."""
        return replace(self, failures=0, retry_at=None, last_error=None)

    def noted(self, error: str) -> Pool:
        """Its `last_error` says why no VM of it starts now (no failure is counted)."""
        return replace(self, last_error=error[:ERROR_CHARS])


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

    # Its transitions: the second table in this module's docstring.

    def saving(self, host_key: str | None) -> PoolVm:
        """It answered; libvirt is to save it (a `saved` pool's VM)."""
        check_from("pool VM", self.id, self.state, ("starting",), "saving")
        return replace(self, state="saving", host_key=host_key)

    def settled(self, host_key: str | None, now: datetime) -> PoolVm:
        """Its start is done: `ready` (a `running` pool's) or `saved`, ready to hand out."""
        check_from("pool VM", self.id, self.state, ("starting", "saving"), "settled")
        return replace(self, state="saved" if self.goal == "saved" else "ready",
                       host_key=host_key, ready_at=now)

    def destroying(self) -> PoolVm:
        """No hand-out takes it any more: its domain and files are to go (from any
        state, and again from `destroying` when a destroy was cut)."""
        return replace(self, state="destroying")

    def handed_out(self) -> PoolVm:
        """Taken for a new VM (its row goes; a VM row of its id takes its place)."""
        check_from("pool VM", self.id, self.state, ("ready", "saved"), "handed out")
        return self

    def removed(self) -> PoolVm:
        """Its row goes: its domain never came (starting, saving) or is gone (destroying)."""
        check_from("pool VM", self.id, self.state, ("starting", "saving", "destroying"),
                   "removed")
        return self
