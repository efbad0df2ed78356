"""The E2B sandboxes' repository (``tx.sandboxes``, migration 0015) on every
database: a sandbox's settings read back as written, the owner's list oldest
first, ends moved and found when due, rows removed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.sandboxes import Sandbox
from rift.domain.store_errors import DuplicateKey, ReadOnlyTransaction
from rift.services.ports import Store

T0 = datetime(2026, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def a_sandbox(vm_id: str, owner: str = "ada", started: float = 0,
              end: float | None = 300) -> Sandbox:
    return Sandbox(vm_id, owner, "task_x", "base", T0 + timedelta(seconds=started),
                   None if end is None else T0 + timedelta(seconds=end),
                   {"k": "v", "ü": "ß"}, {"A": "1"}, secure=True, public_traffic=False,
                   traffic_digest="d" * 64, on_timeout="pause", auto_resume=True)


def test_a_sandbox_reads_back_as_written_and_lists_under_its_owner_oldest_first(
        store: Store) -> None:
    with store.write() as tx:
        tx.sandboxes.add(a_sandbox("vm_b", started=5))
        tx.sandboxes.add(a_sandbox("vm_a", started=1))
        tx.sandboxes.add(a_sandbox("vm_c", owner="bob"))
    with store.read() as tx:
        assert tx.sandboxes.get("vm_a") == a_sandbox("vm_a", started=1)
        assert tx.sandboxes.get("vm_zz") is None
        assert [s.vm_id for s in tx.sandboxes.of_owner("ada")] == ["vm_a", "vm_b"]
        assert [s.vm_id for s in tx.sandboxes.of_owner("bob")] == ["vm_c"]
        with pytest.raises(ReadOnlyTransaction):
            tx.sandboxes.remove("vm_a")
    with store.write() as tx, pytest.raises(DuplicateKey):
        tx.sandboxes.add(a_sandbox("vm_a"))


def test_ends_move_and_are_due_at_or_after_them_earliest_first(store: Store) -> None:
    with store.write() as tx:
        tx.sandboxes.add(a_sandbox("vm_a", end=60))
        tx.sandboxes.add(a_sandbox("vm_b", end=30))
        tx.sandboxes.add(a_sandbox("vm_c", end=None))
    with store.read() as tx:
        assert [s.vm_id for s in tx.sandboxes.due(T0 + timedelta(seconds=29), 10)] == []
        assert [s.vm_id for s in tx.sandboxes.due(T0 + timedelta(seconds=60), 10)] == \
            ["vm_b", "vm_a"]
        assert len(tx.sandboxes.due(T0 + timedelta(days=9), 1)) == 1
    with store.write() as tx:
        assert tx.sandboxes.set_end("vm_b", T0 + timedelta(seconds=90))
        assert tx.sandboxes.set_traffic("vm_b", None)
        assert not tx.sandboxes.set_end("vm_gone", T0)
        assert tx.sandboxes.remove("vm_a")
        assert not tx.sandboxes.remove("vm_a")
    with store.read() as tx:
        assert [s.vm_id for s in tx.sandboxes.due(T0 + timedelta(seconds=60), 10)] == []
        moved = tx.sandboxes.get("vm_b")
        assert moved is not None
        assert (moved.end_at, moved.traffic_digest) == (T0 + timedelta(seconds=90), None)
