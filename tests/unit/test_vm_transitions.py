"""A VM's transitions (the table in rift.domain.model): each answers the VM as it is
after the change and the event that records it (where one does), and refuses a
status or change it does not start from; no store is involved."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rift.domain.errors import IllegalTransition
from rift.domain.model import (
    HOLDING_VM_STATUSES,
    LIVE_VM_STATUSES,
    NewEvent,
    Vm,
    VmChange,
    VmStatus,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(seconds=5)
STATUSES: tuple[VmStatus, ...] = ("creating", "running", "paused", "failed", "destroyed")
CHANGES: tuple[VmChange, ...] = ("pausing", "resuming", "snapshotting")


def a_vm(status: VmStatus = "running", change: VmChange | None = None, **more: Any) -> Vm:
    vm = Vm(id="vm_abcdefgh", task_id="task_abcdefgh", owner="alice", name="web",
            image="tiny", status=status, host="local", vcpus=1, memory_mib=256,
            created_at=T0, ssh_host="127.0.0.1", ssh_port=40022, change=change,
            change_at=None if change is None else T0)
    return replace(vm, **more)


def refuses(transition: Callable[[], object]) -> bool:
    try:
        transition()
    except IllegalTransition as refusal:
        assert refusal.code == "internal"
        return True
    return False


def event(kind: str, details: dict[str, Any], by: str = "mcp:agent") -> NewEvent:
    return NewEvent("task_abcdefgh", kind, LATER, by, {"vm_id": "vm_abcdefgh", **details})


# running

def test_a_creating_vm_runs_with_how_it_started() -> None:
    vm = a_vm("creating")
    new, ev = vm.running(("pool", 840), "mcp:agent", LATER, {"boot_s": 0.5})
    assert new == replace(vm, status="running", ready_at=LATER, start_kind="pool",
                          start_ms=840)
    assert ev == event("vm_running", {"start_kind": "pool", "start_ms": 840, "boot_s": 0.5})


@pytest.mark.parametrize("status", [s for s in STATUSES if s != "creating"])
def test_only_a_creating_vm_comes_to_run(status: VmStatus) -> None:
    assert refuses(lambda: a_vm(status).running(("boot", 1), "mcp:agent", LATER))


# failed

@pytest.mark.parametrize("status", ["creating", "running", "paused"])
def test_a_live_vm_fails_with_its_error(status: VmStatus) -> None:
    vm = a_vm(status, "pausing" if status == "running" else None)
    new, ev = vm.failed("the domain is gone", "sweep", LATER)
    assert new == replace(vm, status="failed", error="the domain is gone")
    assert new.change == vm.change  # reconciliation still reads what was under way
    assert ev == event("vm_failed", {"error": "the domain is gone"}, by="sweep")


@pytest.mark.parametrize("status", ["failed", "destroyed"])
def test_a_vm_that_is_not_live_does_not_fail_again(status: VmStatus) -> None:
    assert refuses(lambda: a_vm(status).failed("x", "sweep", LATER))


# destroy requested, destroyed

@pytest.mark.parametrize("status", ["creating", "running", "paused", "failed"])
def test_a_destroy_is_asked_for_once_and_the_first_time_is_kept(status: VmStatus) -> None:
    vm = a_vm(status)
    asked = vm.destroy_requested(T0)
    assert asked == replace(vm, destroy_requested_at=T0)
    assert asked.status == status and not asked.keeps_execs
    assert asked.destroy_requested(LATER) == asked


def test_a_destroyed_vm_is_refused_a_destroy_request() -> None:
    assert refuses(lambda: a_vm("destroyed").destroy_requested(LATER))


@pytest.mark.parametrize("status", ["creating", "running", "paused", "failed"])
def test_any_vm_not_destroyed_is_destroyed_with_its_host(status: VmStatus) -> None:
    vm = a_vm(status)
    new, ev = vm.destroyed("mcp:agent", LATER, {"reason": "task closed"})
    assert new == replace(vm, status="destroyed", destroyed_at=LATER)
    assert not new.is_live
    assert ev == event("vm_destroyed", {"host": "local", "reason": "task closed"})


def test_a_destroyed_vm_is_not_destroyed_twice() -> None:
    assert refuses(lambda: a_vm("destroyed").destroyed("mcp:agent", LATER))


# changes begun

@pytest.mark.parametrize(("status", "change"), [("running", "pausing"),
                                                ("running", "snapshotting"),
                                                ("paused", "resuming")])
def test_a_change_begins_from_its_status_with_none_under_way(status: VmStatus,
                                                             change: VmChange) -> None:
    vm = a_vm(status)
    assert vm.changing(change, LATER) == replace(vm, change=change, change_at=LATER)


@pytest.mark.parametrize(("status", "change"), [
    (status, change) for status in STATUSES for change in CHANGES
    if (status, change) not in (("running", "pausing"), ("running", "snapshotting"),
                                ("paused", "resuming"))])
def test_a_change_is_refused_from_another_status(status: VmStatus, change: VmChange) -> None:
    assert refuses(lambda: a_vm(status).changing(change, LATER))


@pytest.mark.parametrize("under_way", CHANGES)
def test_a_change_is_refused_while_another_is_under_way(under_way: VmChange) -> None:
    status: VmStatus = "paused" if under_way == "resuming" else "running"
    for change in CHANGES:
        assert refuses(lambda change=change: a_vm(status, under_way).changing(change, LATER))


# paused, resumed

def test_a_pausing_vm_is_paused_with_its_event() -> None:
    vm = a_vm("running", "pausing")
    new, ev = vm.paused("mcp:agent", LATER, {"saved_bytes": 1})
    assert new == replace(vm, status="paused", change=None, change_at=None)
    assert ev == event("vm_paused", {"saved_bytes": 1})


@pytest.mark.parametrize(("status", "change"), [
    ("running", None), ("running", "snapshotting"), ("paused", None), ("paused", "resuming"),
    ("creating", None), ("failed", "pausing"), ("destroyed", None)])
def test_only_a_pausing_running_vm_is_paused(status: VmStatus, change: VmChange | None) -> None:
    assert refuses(lambda: a_vm(status, change).paused("mcp:agent", LATER))


@pytest.mark.parametrize("change", ["resuming", None])
def test_a_paused_vm_resumes_its_resume_done_or_its_domain_started(
        change: VmChange | None) -> None:
    vm = a_vm("paused", change)
    new, ev = vm.resumed("sweep", LATER, {"reason": "its domain was started outside Rift"})
    assert new == replace(vm, status="running", change=None, change_at=None)
    assert ev == event("vm_resumed", {"reason": "its domain was started outside Rift"},
                       by="sweep")


@pytest.mark.parametrize(("status", "change"), [
    ("running", None), ("running", "pausing"), ("creating", None), ("failed", None),
    ("destroyed", None)])
def test_only_a_paused_vm_resumes(status: VmStatus, change: VmChange | None) -> None:
    assert refuses(lambda: a_vm(status, change).resumed("mcp:agent", LATER))


# a change ended with no new status

@pytest.mark.parametrize(("status", "change"), [("running", "pausing"),
                                                ("running", "snapshotting"),
                                                ("paused", "resuming")])
def test_a_change_rolled_back_or_a_snapshot_saved_leaves_no_change(
        status: VmStatus, change: VmChange) -> None:
    vm = a_vm(status, change)
    assert vm.change_ended() == replace(vm, change=None, change_at=None)


@pytest.mark.parametrize("status", STATUSES)
def test_no_change_ends_where_none_is_under_way(status: VmStatus) -> None:
    assert refuses(lambda: a_vm(status).change_ended())


def test_a_change_of_a_vm_that_is_no_longer_live_does_not_end() -> None:
    assert refuses(lambda: a_vm("destroyed", "pausing").change_ended())


# moved

def test_a_running_vm_moves_to_another_host_and_port() -> None:
    vm = a_vm("running")
    new, ev = vm.moved(("east", 40100), "operator", LATER, {"ms": 1200})
    assert new == replace(vm, host="east", ssh_port=40100)
    assert ev == event("vm_moved", {"from": "local", "to": "east", "ssh_port": 40100,
                                    "ms": 1200}, by="operator")


@pytest.mark.parametrize("status", [s for s in STATUSES if s != "running"])
def test_only_a_running_vm_moves(status: VmStatus) -> None:
    assert refuses(lambda: a_vm(status).moved(("east", 40100), "operator", LATER))


# noted

@pytest.mark.parametrize("status", ["creating", "running", "paused"])
def test_a_live_vm_notes_why_it_may_not_answer_and_forgets_it(status: VmStatus) -> None:
    vm = a_vm(status)
    noted = vm.noted("host east unreachable")
    assert noted == replace(vm, error="host east unreachable")
    assert noted.noted(None) == vm


@pytest.mark.parametrize("status", ["failed", "destroyed"])
def test_a_vm_that_is_not_live_takes_no_note(status: VmStatus) -> None:
    assert refuses(lambda: a_vm(status).noted("host east unreachable"))


# sleep and wake (SPEC §17)

ALL_STATUSES: tuple[VmStatus, ...] = (*STATUSES, "sleeping")
EVERY_STATE = [(s, ch) for s in ALL_STATUSES
               for ch in (None, *CHANGES, "falling_asleep", "waking")]


def test_a_sleeping_vm_is_live_and_holds_no_vcpus_or_memory() -> None:
    assert "sleeping" in LIVE_VM_STATUSES and "sleeping" not in HOLDING_VM_STATUSES
    assert a_vm("sleeping").is_live and a_vm("sleeping").keeps_execs


def test_a_running_vm_begins_to_fall_asleep_and_a_sleeping_one_to_wake() -> None:
    vm = a_vm("running")
    assert vm.changing("falling_asleep", LATER) == replace(vm, change="falling_asleep",
                                                           change_at=LATER)
    asleep = a_vm("sleeping")
    assert asleep.changing("waking", LATER) == replace(asleep, change="waking",
                                                       change_at=LATER)


@pytest.mark.parametrize(("status", "change"), EVERY_STATE)
def test_only_a_running_vm_with_no_change_falls_asleep(status: VmStatus,
                                                        change: VmChange | None) -> None:
    begins = not refuses(lambda: a_vm(status, change).changing("falling_asleep", LATER))
    assert begins == ((status, change) == ("running", None))


@pytest.mark.parametrize(("status", "change"), EVERY_STATE)
def test_only_a_sleeping_vm_with_no_change_begins_to_wake(status: VmStatus,
                                                          change: VmChange | None) -> None:
    begins = not refuses(lambda: a_vm(status, change).changing("waking", LATER))
    assert begins == ((status, change) == ("sleeping", None))


def test_a_vm_falling_asleep_sleeps_with_its_event() -> None:
    vm = a_vm("running", "falling_asleep")
    new, ev = vm.slept("sweep", LATER, {"quiet_s": 961})
    assert new == replace(vm, status="sleeping", change=None, change_at=None)
    assert ev == event("vm_slept", {"quiet_s": 961}, by="sweep")


@pytest.mark.parametrize(("status", "change"), EVERY_STATE)
def test_only_a_vm_falling_asleep_sleeps(status: VmStatus, change: VmChange | None) -> None:
    sleeps = not refuses(lambda: a_vm(status, change).slept("sweep", LATER))
    assert sleeps == ((status, change) == ("running", "falling_asleep"))


def test_a_waking_vm_runs_again_with_how_long_the_wake_took() -> None:
    vm = a_vm("sleeping", "waking")
    new, ev = vm.woke(840, "mcp:agent", LATER)
    assert new == replace(vm, status="running", change=None, change_at=None, woke_ms=840)
    assert ev == event("vm_woke", {"ms": 840})


@pytest.mark.parametrize(("status", "change"), EVERY_STATE)
def test_only_a_waking_vm_wakes(status: VmStatus, change: VmChange | None) -> None:
    wakes = not refuses(lambda: a_vm(status, change).woke(1, "mcp:agent", LATER))
    assert wakes == ((status, change) == ("sleeping", "waking"))


def test_a_sleeping_vm_is_paused_without_a_save() -> None:
    vm = a_vm("sleeping")
    new, ev = vm.paused("mcp:agent", LATER, {"was": "sleeping"})
    assert new == replace(vm, status="paused")
    assert ev == event("vm_paused", {"was": "sleeping"})


@pytest.mark.parametrize(("status", "change"), EVERY_STATE)
def test_a_pause_ends_only_from_pausing_or_from_sleep(status: VmStatus,
                                                      change: VmChange | None) -> None:
    ends = not refuses(lambda: a_vm(status, change).paused("mcp:agent", LATER))
    assert ends == ((status, change) in (("running", "pausing"), ("sleeping", None)))


@pytest.mark.parametrize("change", ["falling_asleep", "waking"])
def test_a_sleep_or_wake_is_rolled_back_to_the_status_it_left(change: VmChange) -> None:
    status: VmStatus = "running" if change == "falling_asleep" else "sleeping"
    vm = a_vm(status, change)
    assert vm.change_ended() == replace(vm, change=None, change_at=None)


def test_a_sleeping_vm_fails_and_is_destroyed_like_any_live_vm() -> None:
    vm = a_vm("sleeping")
    failed, ev = vm.failed("its wake failed: no saved state", "mcp:agent", LATER)
    assert failed.status == "failed" and ev.type == "vm_failed"
    destroyed, ev = vm.destroyed("mcp:agent", LATER)
    assert destroyed.status == "destroyed" and ev.type == "vm_destroyed"
    assert vm.destroy_requested(T0).destroy_requested_at == T0
