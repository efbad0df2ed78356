"""Login throttling as a rule of counts and times (no password is checked here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.records import LoginFailures
from rift.services.access.sessions import PER_ADDRESS, PER_NAME_AND_ADDRESS, session_form_token

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def failures(count: int, seconds_ago: float = 0) -> LoginFailures:
    return LoginFailures("k", count, T0 - timedelta(seconds=seconds_ago))


@pytest.mark.parametrize(("count", "wait"), [
    (0, 0), (2, 0), (3, 1), (4, 2), (5, 4), (10, 128), (11, 256), (12, 300), (10_000, 300)])
def test_a_name_and_address_get_three_free_failures_then_doubling_waits(
        count: int, wait: float) -> None:
    assert PER_NAME_AND_ADDRESS.wait_s(failures(count), T0) == wait


def test_the_wait_runs_from_the_last_failure_and_counts_are_forgotten() -> None:
    assert PER_NAME_AND_ADDRESS.wait_s(failures(5, seconds_ago=3), T0) == 1
    assert PER_NAME_AND_ADDRESS.wait_s(failures(5, seconds_ago=10), T0) == 0
    assert PER_NAME_AND_ADDRESS.wait_s(failures(30, seconds_ago=900), T0) == 0
    assert PER_NAME_AND_ADDRESS.wait_s(None, T0) == 0


def test_an_address_spraying_many_names_is_slowed_after_thirty() -> None:
    assert PER_ADDRESS.wait_s(failures(29), T0) == 0
    assert PER_ADDRESS.wait_s(failures(30), T0) == 1


def test_the_logout_token_is_bound_to_the_session() -> None:
    assert session_form_token("a" * 43) != session_form_token("b" * 43)
    assert session_form_token("a" * 43) == session_form_token("a" * 43)
