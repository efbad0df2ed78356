"""A pooled VM's transitions (the table in rift.domain.records): each answers the
pooled VM as it is after the change, and refuses a state it does not start from;
no store is involved."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.errors import IllegalTransition
from rift.domain.pools import PoolGoal, PoolVm, PoolVmState

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(seconds=2)
STATES: tuple[PoolVmState, ...] = ("starting", "ready", "saving", "saved", "destroying")
KEY = "ssh-ed25519 AAAA"


def pooled(state: PoolVmState, goal: PoolGoal = "running") -> PoolVm:
    return PoolVm(id="vm_abcdefgh", pool_id="pool_abcdefgh", goal=goal, state=state,
                  host="local", image="tiny", vcpus=1, memory_mib=256, key_id="pool_abcdefgh",
                  mark="build-1", created_at=T0, ssh_port=40022)


def test_a_starting_vm_of_a_saved_pool_turns_saving_with_its_host_key() -> None:
    pvm = pooled("starting", "saved")
    assert pvm.saving(KEY) == replace(pvm, state="saving", host_key=KEY)


@pytest.mark.parametrize("state", [s for s in STATES if s != "starting"])
def test_only_a_starting_vm_turns_saving(state: PoolVmState) -> None:
    with pytest.raises(IllegalTransition):
        pooled(state, "saved").saving(KEY)


def test_a_running_pools_vm_settles_ready() -> None:
    pvm = pooled("starting", "running")
    assert pvm.settled(KEY, LATER) == replace(pvm, state="ready", host_key=KEY, ready_at=LATER)


def test_a_saved_pools_vm_settles_saved_once_saving() -> None:
    pvm = pooled("saving", "saved")
    assert pvm.settled(KEY, LATER) == replace(pvm, state="saved", host_key=KEY, ready_at=LATER)


@pytest.mark.parametrize("state", ["ready", "saved", "destroying"])
def test_a_vm_that_is_not_starting_settles_no_more(state: PoolVmState) -> None:
    with pytest.raises(IllegalTransition):
        pooled(state).settled(KEY, LATER)


@pytest.mark.parametrize("state", STATES)
def test_any_pooled_vm_can_turn_destroying(state: PoolVmState) -> None:
    pvm = pooled(state)
    assert pvm.destroying() == replace(pvm, state="destroying")


@pytest.mark.parametrize("state", ["ready", "saved"])
def test_a_ready_or_saved_vm_can_be_handed_out(state: PoolVmState) -> None:
    pvm = pooled(state)
    assert pvm.handed_out() == pvm


@pytest.mark.parametrize("state", ["starting", "saving", "destroying"])
def test_a_vm_not_yet_ready_or_going_is_refused_hand_out(state: PoolVmState) -> None:
    with pytest.raises(IllegalTransition):
        pooled(state).handed_out()


@pytest.mark.parametrize("state", ["starting", "saving", "destroying"])
def test_the_row_of_a_vm_that_never_came_or_is_destroyed_can_go(state: PoolVmState) -> None:
    pvm = pooled(state)
    assert pvm.removed() == pvm


@pytest.mark.parametrize("state", ["ready", "saved"])
def test_the_row_of_a_vm_ready_to_hand_out_is_refused_removal(state: PoolVmState) -> None:
    with pytest.raises(IllegalTransition):
        pooled(state).removed()
