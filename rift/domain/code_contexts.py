"""Code contexts as the control plane knows them (SPEC §20): one row per context of
a VM, written by the engine when a context is made, run, restarted or deleted, and
gone with its VM. The kernel and its state live in the guest (rift-code); the row
is what the VM's view and the Boxes page show (its language, its last run) and
what the sleep sweep counts: a run in flight keeps its VM awake, as an exec does
(SPEC §17).

A run in flight is `run_id` with `run_until`, the latest it can end (its start,
or the end of the runs queued before it, plus its `timeout_s` and the guest's
interrupt grace): a mark no call clears (a run that went on past its call and
ended unread) stops counting then, or when the guest, asked, says it ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

DEFAULT = "default"  # the VM's own Python context
# The meta key each change of a VM's contexts sets (a new token): part of the Boxes
# page's change mark, as a run appends no task event.
MARK_KEY = "code_contexts_changed"
INTERRUPT_GRACE_S = 15  # past a run's timeout: the guest's interrupt, its kernel's end


@dataclass(frozen=True)
class CodeContext:
    vm_id: str
    id: str
    task_id: str
    language: str
    cwd: str | None
    created_at: datetime
    last_run_at: datetime | None = None
    execution_count: int | None = None
    last_status: str | None = None
    run_id: str | None = None
    run_until: datetime | None = None

    def running_at(self, now: datetime) -> bool:
        """A run in flight that may still be running at `now`."""
        return self.run_id is not None and self.run_until is not None and self.run_until > now


@dataclass(frozen=True)
class RunStart:
    """A run a call starts: its context, its id and its timeout."""

    context_id: str
    run_id: str
    timeout_s: int


@dataclass(frozen=True)
class RunEnd:
    """A context's last run as a call saw it end: the run (None: whichever was in
    flight), when it ended, the kernel's execution count and the run's status."""

    run_id: str | None
    at: datetime | None
    execution_count: int | None
    status: str | None
