"""The events of `GET /execs/{id}/stream` (SPEC §10), from the views its reads
answer: output events with the offsets to resume from, a comment while quiet,
the end, and a refusal that ends the stream."""

from __future__ import annotations

import json
from typing import Any

from rift.api.exec_stream import exec_events, resumed
from rift.contract.views import ExecView
from rift.domain.errors import LeaseStale

BASE: dict[str, Any] = {
    "exec_id": "exec_abcdefgh", "vm_id": "vm_abcdefgh", "command": "make", "status": "running",
    "exit_code": None, "signal": None, "timed_out": False, "started_at": "2026-12-02T00:00:00Z",
    "ended_at": None, "duration_ms": None, "stdout": "", "stderr": "", "stdout_offset": 0,
    "stderr_offset": 0, "stdout_bytes": 0, "stderr_bytes": 0, "truncated": False}


def view(**changes: Any) -> ExecView:
    return ExecView(**(BASE | changes))


def parse(stream: list[str]) -> list[tuple[str | None, str | None, Any]]:
    """(id, event, data) per event; comments as (None, None, text)."""
    out: list[tuple[str | None, str | None, Any]] = []
    for block in stream:
        assert block.endswith("\n\n"), block
        if block.startswith(":"):
            out.append((None, None, block[1:].strip()))
            continue
        fields = dict(line.split(": ", 1) for line in block.strip().split("\n"))
        out.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
    return out


def test_output_then_quiet_then_the_end() -> None:
    reads = iter([view(stdout_offset=6, stdout_bytes=6),
                  view(stderr="warn\r\n", stdout_offset=6, stderr_offset=6, truncated=True),
                  view(status="exited", exit_code=0, stdout="bye\n", stdout_offset=10,
                       stderr_offset=6, stdout_bytes=10, stderr_bytes=6)])
    asked: list[tuple[int, int]] = []

    def read(out: int, err: int) -> ExecView:
        asked.append((out, err))
        return next(reads)

    events = parse(list(exec_events(view(stdout="hello\n", stdout_offset=6), read)))
    assert events[0] == ("6-0", "stdout", {"text": "hello\n", "next_offset": 6})
    assert events[1] == (None, None, "still running")
    assert events[2] == ("6-6", "stderr", {"text": "warn\r\n", "next_offset": 6,
                                           "truncated": True})
    assert events[3] == ("10-6", "stdout", {"text": "bye\n", "next_offset": 10})
    kind, end = events[4][1], events[4][2]
    assert kind == "end" and end["status"] == "exited" and end["exit_code"] == 0
    assert "stdout" not in end and end["stdout_bytes"] == 10
    assert len(events) == 5 and asked == [(6, 0), (6, 0), (6, 6)]


def test_a_lease_that_moved_on_ends_the_stream_with_its_refusal() -> None:
    def read(out: int, err: int) -> ExecView:
        raise LeaseStale("task_abcdefgh", "mcp:cursor", "2026-12-02T00:00:00Z")

    events = parse(list(exec_events(view(), read)))
    assert events[-1][1] == "refused" and events[-1][2]["error"]["code"] == "lease_stale"


def test_a_resumed_stream_starts_at_the_offsets_of_its_last_event() -> None:
    assert resumed("10-6") == (10, 6)
    assert resumed(None) is None and resumed("x-1") is None and resumed("1-2-3") is None
    assert resumed("9" * 19 + "-0") == (2**62, 0)
