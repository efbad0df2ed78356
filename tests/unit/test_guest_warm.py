"""The warm-up after a start (rift.guest.warm): a call to the VM waits for the one in
flight instead of opening a connection beside it, no longer than its bound, and a
warm-up that fails leaves the VM's calls as they were."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rift.domain.model import Vm
from rift.guest import warm
from rift.guest.connections import Connections, ShellSettings
from rift.guest.routes import Routes
from rift.guest.warm import WARM_UP_LINE, Warmer


def _vm() -> Vm:
    return Vm(id="vm_warm0001", task_id="task_warm0001", owner="alice", name="w", image="tiny",
              status="running", host="local", vcpus=1, memory_mib=256,
              created_at=datetime(2026, 1, 1, tzinfo=UTC), ssh_host="127.0.0.1", ssh_port=9)


def _warmer(tmp_path: Path) -> Warmer:
    return Warmer(Connections(tmp_path, ShellSettings(), Routes()))


def test_a_call_waits_for_the_warm_up_in_flight_then_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    warmer, release, ran = _warmer(tmp_path), threading.Event(), []

    def slow_warm(vm: Vm) -> float:
        release.wait(5)
        ran.append(vm.id)
        return 0.1

    monkeypatch.setattr(warmer, "warm", slow_warm)
    warmer.warm_later(_vm())
    waited: list[float] = []

    def call() -> None:
        began = time.monotonic()
        warmer.settle("vm_warm0001")
        waited.append(time.monotonic() - began)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.2)
    assert not waited, "the call went on while the warm-up ran"
    release.set()
    caller.join(5)
    assert ran == ["vm_warm0001"] and 0.15 < waited[0] < 5
    assert warmer.warming == {}
    began = time.monotonic()
    warmer.settle("vm_warm0001")  # none in flight: no wait (a wait is WARM_S, 10 s)
    assert time.monotonic() - began < 1.0


def test_a_warm_up_that_hangs_holds_a_call_no_longer_than_its_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "WARM_S", 0.2)
    monkeypatch.setattr(warm, "GRACE_S", 0.1)
    warmer, never = _warmer(tmp_path), threading.Event()

    def hung_warm(vm: Vm) -> float | None:
        never.wait(10)
        return None

    monkeypatch.setattr(warmer, "warm", hung_warm)
    warmer.warm_later(_vm())
    began = time.monotonic()
    warmer.settle("vm_warm0001")
    assert 0.25 < time.monotonic() - began < 2
    never.set()


def test_a_warm_up_that_cannot_reach_its_guest_answers_none(tmp_path: Path) -> None:
    # no key for its task: the pooled connection fails at once, as a dead guest's would
    assert _warmer(tmp_path).warm(_vm()) is None


def test_the_warm_up_runs_the_helper_bounded_and_removes_its_folder() -> None:
    assert " start /run/rift-exec/warm-up-$$ 5 " in WARM_UP_LINE
    assert WARM_UP_LINE.endswith("rm -rf /run/rift-exec/warm-up-$$")
    assert WARM_UP_LINE.startswith("[ -x ")  # a guest without the helper: nothing to do
