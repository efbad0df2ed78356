"""A pool's transitions (the first table in rift.domain.pools): each answers the
pool as it is after the change, and a fill's claim refuses a pool another filler
holds; no store is involved."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rift.domain.errors import IllegalTransition
from rift.domain.pools import BACKOFF_S, Pool

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(seconds=30)


def a_pool(**more: Any) -> Pool:
    pool = Pool(id="pool_abcdefgh", image="tiny", host=None, vcpus=1, memory_mib=256,
                running=2, saved=1, created_at=T0)
    return replace(pool, **more)


BACKING_OFF = {"failures": 2, "retry_at": LATER, "last_error": "no room"}


def test_a_resize_sets_the_goal_and_starts_the_back_off_over() -> None:
    pool = a_pool(**BACKING_OFF)
    assert pool.resized(3, 0) == a_pool(running=3, saved=0)


def test_emptied_wants_no_vm_and_keeps_the_back_off() -> None:
    pool = a_pool(**BACKING_OFF)
    assert pool.emptied() == replace(pool, running=0, saved=0)


@pytest.mark.parametrize(("filler", "until"), [
    (None, None),  # no one fills it
    ("replica-a", LATER),  # it fills it itself
    ("replica-b", T0 - timedelta(seconds=1)),  # b's claim ran out
])
def test_a_free_pool_is_claimed_for_a_filler_until_a_time(filler: str | None,
                                                          until: datetime | None) -> None:
    pool = a_pool(filler=filler, fill_until=until)
    assert pool.free_for("replica-a", T0)
    claimed = pool.fill_claimed("replica-a", T0, T0 + timedelta(seconds=60))
    assert claimed == replace(pool, filler="replica-a", fill_until=T0 + timedelta(seconds=60))


def test_a_pool_another_filler_holds_is_refused_a_claim() -> None:
    pool = a_pool(filler="replica-b", fill_until=LATER)
    assert not pool.free_for("replica-a", T0)
    with pytest.raises(IllegalTransition) as refused:
        pool.fill_claimed("replica-a", T0, LATER)
    assert refused.value.code == "internal"


@pytest.mark.parametrize("filler", [None, "replica-a"])
def test_a_fill_is_released_for_any_replica(filler: str | None) -> None:
    pool = a_pool(filler=filler, fill_until=LATER if filler else None)
    assert pool.fill_released() == a_pool()


def test_failed_starts_back_off_longer_each_time_up_to_the_last_step() -> None:
    pool = a_pool()
    waits = []
    for failures in range(1, len(BACKOFF_S) + 2):
        pool = pool.start_failed("x" * 600, T0)
        assert pool.failures == failures and pool.last_error == "x" * 500
        assert pool.retry_at is not None
        waits.append((pool.retry_at - T0).total_seconds())
    assert waits == [*BACKOFF_S, BACKOFF_S[-1]]


def test_a_start_done_ends_the_back_off() -> None:
    assert a_pool(**BACKING_OFF).start_done() == a_pool()


def test_a_note_says_why_no_vm_starts_without_counting_a_failure() -> None:
    pool = a_pool()
    assert pool.noted("disk full") == replace(pool, last_error="disk full")
