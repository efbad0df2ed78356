"""A snapshot's transitions (the table in rift.domain.records): each answers the
snapshot as it is after the change and its event, and refuses a state it does not
start from; no store is involved."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.errors import IllegalTransition
from rift.domain.model import NewEvent
from rift.domain.records import Snapshot, SnapshotState

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(seconds=3)


def snapshot(state: SnapshotState) -> Snapshot:
    return Snapshot(id="snap_abcdefgh", task_id="task_abcdefgh", vm_id="vm_abcdefgh",
                    owner="alice", name="before", host="local", image="tiny", vcpus=1,
                    memory_mib=256, disk_gib=10, state=state, created_at=T0)


def test_a_snapshot_being_made_turns_ready_with_its_size_and_host_key() -> None:
    snap = snapshot("making")
    new, event = snap.made(4096, "ssh-ed25519 AAAA", "mcp:agent", LATER)
    assert new == replace(snap, state="ready", bytes=4096, host_key="ssh-ed25519 AAAA")
    assert event == NewEvent("task_abcdefgh", "snapshot_made", LATER, "mcp:agent", {
        "snapshot_id": "snap_abcdefgh", "vm_id": "vm_abcdefgh", "name": "before",
        "bytes": 4096})


@pytest.mark.parametrize("state", ["ready", "deleting"])
def test_only_a_snapshot_being_made_can_be_made(state: SnapshotState) -> None:
    with pytest.raises(IllegalTransition) as refused:
        snapshot(state).made(1, None, "mcp:agent", LATER)
    assert refused.value.code == "internal"


def test_a_ready_snapshot_turns_deleting_with_its_event() -> None:
    snap = snapshot("ready")
    new, event = snap.deleting("mcp:agent", LATER)
    assert new == replace(snap, state="deleting")
    assert event == NewEvent("task_abcdefgh", "snapshot_deleted", LATER, "mcp:agent",
                             {"snapshot_id": "snap_abcdefgh", "vm_id": "vm_abcdefgh"})


def test_a_deletion_for_a_reason_names_it_in_the_event() -> None:
    _, event = snapshot("ready").deleting("sweep", LATER, "task closed")
    assert event.details["reason"] == "task closed"


@pytest.mark.parametrize("state", ["making", "deleting"])
def test_only_a_ready_snapshot_can_be_deleted(state: SnapshotState) -> None:
    with pytest.raises(IllegalTransition):
        snapshot(state).deleting("mcp:agent", LATER)


@pytest.mark.parametrize("state", ["making", "deleting"])
def test_the_row_of_an_abandoned_or_deleted_snapshot_can_go(state: SnapshotState) -> None:
    snap = snapshot(state)
    assert snap.removed() == snap


def test_the_row_of_a_ready_snapshot_is_refused_removal() -> None:
    with pytest.raises(IllegalTransition):
        snapshot("ready").removed()
