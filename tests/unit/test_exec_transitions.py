"""An exec's transition (the table in rift.domain.model): it ends once, answering
the exec as it ended and its `exec_ended` event, and refuses an exec that ended
already; no store is involved."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.errors import IllegalTransition
from rift.domain.model import Exec, ExecEnd, ExecStatus, NewEvent

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(seconds=9)
ENDS: tuple[ExecStatus, ...] = ("exited", "killed", "timed_out", "lost")


def an_exec(status: ExecStatus = "running") -> Exec:
    return Exec(id="exec_abcdefgh", task_id="task_abcdefgh", vm_id="vm_abcdefgh",
                owner="ada", command="make test", status=status, timeout_s=60,
                started_at=T0, stdout_bytes=10, stderr_bytes=3)


def test_a_running_exec_ends_with_what_its_guest_said_and_its_event() -> None:
    ex = an_exec()
    end = ExecEnd("exited", T0 + timedelta(seconds=8), exit_code=2, duration_ms=8000,
                  totals=(40, 7))
    new, event = ex.ended(end, "mcp:agent", LATER)
    assert new == replace(ex, status="exited", ended_at=T0 + timedelta(seconds=8),
                          exit_code=2, duration_ms=8000, stdout_bytes=40, stderr_bytes=7)
    assert event == NewEvent("task_abcdefgh", "exec_ended", LATER, "mcp:agent", {
        "exec_id": "exec_abcdefgh", "vm_id": "vm_abcdefgh", "status": "exited",
        "exit_code": 2})


def test_an_end_the_guest_did_not_see_keeps_the_totals_last_seen() -> None:
    ex = an_exec()
    new, event = ex.ended(ExecEnd("lost", LATER), "sweep", LATER)
    assert new == replace(ex, status="lost", ended_at=LATER)
    assert (new.stdout_bytes, new.stderr_bytes) == (10, 3)
    assert event.details == {"exec_id": ex.id, "vm_id": ex.vm_id, "status": "lost",
                             "exit_code": None}


def test_a_signal_and_a_timeout_are_recorded() -> None:
    new, _ = an_exec().ended(ExecEnd("timed_out", LATER, signal="KILL", timed_out=True),
                             "sweep", LATER)
    assert (new.status, new.signal, new.timed_out) == ("timed_out", "KILL", True)


@pytest.mark.parametrize("status", ENDS)
def test_an_exec_that_ended_is_refused_another_end(status: ExecStatus) -> None:
    with pytest.raises(IllegalTransition) as refused:
        an_exec(status).ended(ExecEnd("lost", LATER), "sweep", LATER)
    assert refused.value.code == "internal"


def test_an_end_names_an_ended_status() -> None:
    with pytest.raises(ValueError, match="exited, killed, timed_out or lost"):
        ExecEnd("running", LATER)
