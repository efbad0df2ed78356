"""A host's transitions (the table in rift.domain.model): each answers the host as
it is after the change, and refuses a state it does not start from; no store is
involved."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.errors import IllegalTransition
from rift.domain.model import Host

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(seconds=30)


def a_host(state: str = "active") -> Host:
    host = Host(name="local", uri="qemu:///system", vcpus=4, memory_mib=8192,
                created_at=T0)
    if state == "drained":
        return replace(host, drained=True)
    if state == "unreachable":
        return replace(host, unreachable_since=T0, last_error="connection refused")
    return host


STATES = ("active", "drained", "unreachable")


@pytest.mark.parametrize("state", STATES)
def test_the_state_is_what_rift_host_list_shows(state: str) -> None:
    assert a_host(state).state == state


@pytest.mark.parametrize("state", STATES)
def test_any_host_takes_a_new_uri_and_size_keeping_its_state(state: str) -> None:
    host = a_host(state)
    new = host.resized("qemu+ssh://big/system", 64, 262144)
    assert new == replace(host, uri="qemu+ssh://big/system", vcpus=64, memory_mib=262144)
    assert new.state == state


@pytest.mark.parametrize("state", STATES)
def test_any_host_is_drained_and_undrained_again_and_again(state: str) -> None:
    host = a_host(state)
    assert host.set_drain(True) == replace(host, drained=True)
    assert host.set_drain(True).set_drain(True) == replace(host, drained=True)
    assert host.set_drain(True).set_drain(False) == replace(host, drained=False)


@pytest.mark.parametrize("state", ["active", "drained"])
def test_an_answering_host_turns_unreachable_since_now_with_its_error(state: str) -> None:
    host = a_host(state)
    new = host.unreachable(LATER, "timed out")
    assert new == replace(host, unreachable_since=LATER, last_error="timed out")
    assert new.state == "unreachable"


def test_an_unreachable_host_is_refused_unreachable_again_keeping_its_first_time() -> None:
    with pytest.raises(IllegalTransition) as refused:
        a_host("unreachable").unreachable(LATER, "timed out")
    assert refused.value.code == "internal"


def test_an_unreachable_host_answers_again_with_no_error() -> None:
    host = a_host("unreachable")
    assert host.reachable() == replace(host, unreachable_since=None, last_error=None)
    drained = replace(host, drained=True)
    assert drained.reachable().state == "drained"  # its drain outlives the silence


@pytest.mark.parametrize("state", ["active", "drained"])
def test_an_answering_host_is_refused_reachable(state: str) -> None:
    with pytest.raises(IllegalTransition):
        a_host(state).reachable()
