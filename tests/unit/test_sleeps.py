"""Sleep and wake (SPEC §17) in the engine, on fake hosts and guests and the real
store: which VMs the sweep puts to sleep and when, the room they give back, the
calls that wake them (once, however many race), the views that do not, pause and
destroy of a sleeping VM, a wake that fails, changes a crash cut short, and a run of
code in flight keeping its VM awake as a running exec does."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import reconcile, sweeps
from rift.services.context import Deps
from rift.services.lifecycle import code, execs, files, forks, pauses, snapshots, tasks, vms
from rift.services.lifecycle.guest_kinds import test_driver
from rift.services.ports.code import CodeRequest
from rift.services.read.views import task_now
from tests.support.code_guest import HostCode
from tests.support.engine import ALICE, BOB, event_types, refused
from tests.support.fake_guest import FakeExecs, FakeLifecycle, fake_guests
from tests.support.vm_rows import give_ssh_address, leave_cut_change

STEP_S = 60  # LeaseRules' activity step
QUIET_S = 900 + STEP_S + 1  # RIFT_TASK_SLEEP_S's default and one step past it


@pytest.fixture
def life() -> FakeLifecycle:
    return FakeLifecycle()


@pytest.fixture
def gdeps(deps: Deps, life: FakeLifecycle) -> Deps:
    return replace(deps, guests=fake_guests(execs=FakeExecs(), lifecycle=life))


def _vm(deps: Deps, memory_mib: int = 256, **task: object) -> tuple[str, str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn, **task))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="tiny",
             memory_mib=memory_mib)).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id, opened.task.id


def _status(deps: Deps, vm_id: str) -> str:
    return vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm.status


def _exec(deps: Deps, handle: str, vm_id: str, cmd: str = "echo hi", wait_s: int = 5) -> str:
    return execs.start(deps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                       command=cmd, wait_s=wait_s)).status


def test_a_task_quiet_for_its_sleep_time_puts_its_vm_to_sleep_and_an_exec_wakes_it(
        gdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor, life: FakeLifecycle) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    closes_at = task_now(gdeps, task_id).closes_at
    clock.advance(900)  # quiet 900 s, but the stored clock may be a step behind a call
    assert sweeps.sweep(gdeps).slept == [] and _status(gdeps, vm_id) == "running"
    clock.advance(QUIET_S - 900)
    assert sweeps.sweep(gdeps).slept == [vm_id]
    domain = local_hv.domains[f"rift-{vm_id}"]
    assert (domain.active, domain.saved) == (False, True)
    view = vms.get(gdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm  # a view never wakes
    assert (view.status, view.ssh, view.woke) == ("sleeping", None, None)
    assert task_now(gdeps, task_id).closes_at == closes_at  # sleep does not move the close
    assert ("drop_connections", vm_id) in life.calls
    assert _exec(gdeps, handle, vm_id) == "exited"
    assert (domain.active, domain.saved) == (True, False)
    woke = vms.get(gdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert woke.status == "running" and woke.woke is not None and woke.woke.ms >= 0
    assert ("resumed", vm_id) in life.calls  # logged in again, its clock set
    assert life.woken_by == [(vm_id, "exec")]  # its command sets the clock and warms up
    types = event_types(gdeps, task_id)
    assert types.index("vm_slept") < types.index("vm_woke") < types.index("exec_started")


def test_files_an_expose_a_snapshot_and_a_fork_wake_a_sleeping_vm_too(
        gdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    calls = [
        lambda: files.write(gdeps, ALICE, command(c.VmWriteFileIn, handle=handle,
                            vm_id=vm_id, path="/tmp/a", content="x")),
        lambda: files.read(gdeps, ALICE, command(c.VmReadFileIn, handle=handle, vm_id=vm_id,
                           path="/tmp/a")),
        lambda: vms_expose(gdeps, handle, vm_id),
        lambda: snapshots.make(gdeps, ALICE, command(c.VmSnapshotIn, handle=handle,
                               vm_id=vm_id)),
        lambda: forks.fork(gdeps, ALICE, command(c.VmForkIn, handle=handle, vm_id=vm_id)),
    ]
    for call in calls:
        clock.advance(QUIET_S)
        assert sweeps.sweep(gdeps).slept == [vm_id]
        call()
        assert _status(gdeps, vm_id) == "running"
    assert event_types(gdeps, task_id).count("vm_woke") == len(calls)


def vms_expose(deps: Deps, handle: str, vm_id: str) -> None:
    from rift.services.lifecycle import exposures
    exposures.expose(deps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id, port=8000))


def test_sleep_after_s_is_per_task_and_0_never_sleeps(gdeps: Deps, clock: FakeClock) -> None:
    _, soon, _ = _vm(gdeps, sleep_after_s=120)
    _, never, _ = _vm(gdeps, sleep_after_s=0)
    _, default, _ = _vm(gdeps)
    clock.advance(120 + STEP_S + 1)
    assert sweeps.sweep(gdeps).slept == [soon]
    clock.advance(QUIET_S - 120)
    assert sweeps.sweep(gdeps).slept == [default]
    clock.advance(14400 - 10 - (QUIET_S - 120) - (120 + STEP_S + 1))  # before the idle close
    assert sweeps.sweep(gdeps).slept == [] and _status(gdeps, never) == "running"


def test_the_task_view_and_the_boxes_page_show_when_its_vms_sleep(
        gdeps: Deps, clock: FakeClock) -> None:
    from rift.services.read import boxes
    from web.render import live_region

    shown = {}
    for task in ({"sleep_after_s": 120, "sleep": "always"}, {"sleep_after_s": 0}, {}):
        _, _, task_id = _vm(gdeps, **task)
        view = task_now(gdeps, task_id)
        shown[task_id] = (view.sleep_after_s, view.sleep)
    assert list(shown.values()) == [(120, "always"), (0, "idle"), (900, "idle")]
    html = live_region(boxes.read_page(gdeps, ALICE.user), clock.now(),
                       {"mcp_url": "http://rift.test/mcp"})
    facts = [html[html.index(f'id="{task_id}"'):][:1500] for task_id in shown]
    said = [fact[fact.index('class="sleeps"'):].split("</dd>")[0] for fact in facts]
    assert said == ['class="sleeps">after 2 minutes quiet, execs running or not',
                    'class="sleeps">never',
                    'class="sleeps">after 15 minutes quiet with no exec running']


def test_rift_task_sleep_s_0_puts_nothing_to_sleep(make_deps: object, clock: FakeClock) -> None:
    deps = make_deps(task_sleep_s=0)  # type: ignore[operator]
    _, vm_id, _ = _vm(replace(deps, guests=fake_guests()))
    clock.advance(14400 - 10)  # the last sweep before the task closes idle
    assert sweeps.sweep(deps).slept == [] and _status(deps, vm_id) == "running"


@pytest.mark.parametrize("bad", [-1, 7 * 24 * 3600 + 1, 1.5, "900"])
def test_sleep_after_s_out_of_range_is_invalid_argument(gdeps: Deps, bad: object) -> None:
    err = refused("invalid_argument", lambda: tasks.new(gdeps, ALICE, command(
        c.TaskNewIn, sleep_after_s=bad)))
    assert "sleep_after_s" in err.message


def test_a_running_exec_keeps_its_vm_awake_unless_the_task_says_always(
        gdeps: Deps, clock: FakeClock) -> None:
    handle, busy, _ = _vm(gdeps)
    always_handle, always, _ = _vm(gdeps, sleep="always")
    assert _exec(gdeps, handle, busy, "make", wait_s=0) == "running"
    assert _exec(gdeps, always_handle, always, "make", wait_s=0) == "running"
    clock.advance(QUIET_S)
    assert sweeps.sweep(gdeps).slept == [always]
    assert _status(gdeps, busy) == "running"


def test_a_run_of_code_in_flight_keeps_its_vm_awake_as_an_exec_does_until_it_ends(
        gdeps: Deps, clock: FakeClock, tmp_path: Path) -> None:
    guest = HostCode(tmp_path)  # the real rift-code, here: one server for both VMs
    try:
        cdeps = replace(gdeps, code=guest)
        handle, busy, _ = _vm(cdeps)
        always_handle, always, _ = _vm(cdeps, sleep="always")
        forever = "import time\nwhile True: time.sleep(0.05)"
        running = code.run(cdeps, ALICE, command(c.VmRunCodeIn, handle=handle, vm_id=busy,
                                                 code=forever, timeout_s=3600,
                                                 wait_s=0)).execution
        own = code.new_context(cdeps, ALICE, command(c.VmCodeContextNewIn,
                                                     handle=always_handle, vm_id=always))
        other = code.run(cdeps, ALICE, command(
            c.VmRunCodeIn, handle=always_handle, vm_id=always, code=forever,
            context_id=own.context.id, timeout_s=3600, wait_s=0)).execution
        assert running.status == "running"
        clock.advance(QUIET_S)
        assert sweeps.sweep(cdeps).slept == [always]  # the guest says it still runs
        assert _status(cdeps, busy) == "running"
        for context_id in ("default", own.context.id):  # they end, and no call reads them
            guest.request(None, CodeRequest(method="POST", timeout_s=5,
                                            path=f"/contexts/{context_id}/interrupt"))
        for run in (running, other):
            guest.request(None, CodeRequest(method="GET", path=f"/runs/{run.run_id}?"
                                            "wait_ms=10000", timeout_s=15))
        assert sweeps.sweep(cdeps).slept == [busy]
    finally:
        guest.close()


def test_a_call_that_touched_the_task_keeps_its_vm_awake(gdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id, _ = _vm(gdeps)
    clock.advance(QUIET_S - 1)
    tasks.get(gdeps, ALICE, command(c.TaskGetIn, handle=handle))  # activity: a touch
    clock.advance(1)
    assert sweeps.sweep(gdeps).slept == [] and _status(gdeps, vm_id) == "running"


def test_a_boot_longer_than_the_sleep_time_keeps_the_task_awake_while_it_runs(
        gdeps: Deps, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rift_vm_new` is a call in flight while the guest boots: its task's clock moves,
    so neither the new VM nor one the task had falls asleep as it answers (seen on
    a real guest: a 3.6 s boot, then slept at the next sweep with `sleep_after_s` 2)."""
    gdeps = replace(gdeps, lease_rules=replace(gdeps.lease_rules, activity_step_s=1))
    handle, older, _ = _vm(gdeps, sleep_after_s=2)

    def slow_boot(kind: object, vm: object) -> None:
        for _ in range(5):  # five steps of the clock pass while the guest boots
            clock.advance(1)
            time.sleep(0.6)

    monkeypatch.setattr(test_driver.TestDriverGuest, "wait_ready", slow_boot)
    new = vms.new(gdeps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    assert new.status == "running"
    assert sweeps.sweep(gdeps).slept == []
    assert (_status(gdeps, older), _status(gdeps, new.id)) == ("running", "running")
    clock.advance(4)  # quiet for its sleep time and a step, now
    assert sorted(sweeps.sweep(gdeps).slept) == sorted([older, new.id])


def test_a_wake_longer_than_the_sleep_time_keeps_the_tasks_other_vms_awake(
        gdeps: Deps, clock: FakeClock, life: FakeLifecycle,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A call waiting on a wake is a call in flight: while one VM of a task restores,
    the task's clock moves, so another VM of it that a call woke just before does
    not fall asleep under it."""
    gdeps = replace(gdeps, lease_rules=replace(gdeps.lease_rules, activity_step_s=1))
    handle, first, _ = _vm(gdeps, sleep_after_s=2)
    second = vms.new(gdeps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm.id
    with gdeps.store.write() as tx:
        give_ssh_address(tx, second)
    clock.advance(4)
    assert sorted(sweeps.sweep(gdeps).slept) == sorted([first, second])
    assert _exec(gdeps, handle, second) == "exited"  # awake, its task's clock now
    quick, slept_meanwhile = life.resumed, []

    def slow_resume(vm: object, timeout_s: float, **how: object) -> None:
        for _ in range(5):  # five steps of the clock pass while the guest restores
            clock.advance(1)
            time.sleep(0.6)
        slept_meanwhile.extend(sweeps.sweep(gdeps).slept)  # the sweep, mid-wake
        quick(vm, timeout_s, **how)  # type: ignore[arg-type]

    monkeypatch.setattr(life, "resumed", slow_resume)
    assert _exec(gdeps, handle, first) == "exited"
    assert slept_meanwhile == []
    assert (_status(gdeps, first), _status(gdeps, second)) == ("running", "running")


def test_a_sleeping_vm_holds_only_its_disk_and_wakes_only_when_its_host_has_room(
        gdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id, _ = _vm(gdeps, memory_mib=30000)  # most of the host's 32 GiB
    clock.advance(QUIET_S)
    assert sweeps.sweep(gdeps).slept == [vm_id]
    other = tasks.new(gdeps, BOB, command(c.TaskNewIn))
    big = vms.new(gdeps, BOB, command(c.VmNewIn, handle=str(other.handle),
                  memory_mib=30000)).vm  # room only because the first sleeps
    refused("no_capacity", lambda: _exec(gdeps, handle, vm_id))
    assert _status(gdeps, vm_id) == "sleeping"
    vms.destroy(gdeps, BOB, command(c.VmDestroyIn, handle=str(other.handle), vm_id=big.id))
    assert _exec(gdeps, handle, vm_id) == "exited"


def test_a_host_holds_more_open_tasks_than_its_memory_could_run_each_woken_by_its_call(
        gdeps: Deps, clock: FakeClock) -> None:
    made = []
    for _ in range(6):  # 6 x 10,000 MiB open on a host of 32 GiB: at most 3 run at once
        made.append(_vm(gdeps, memory_mib=10000))
        clock.advance(QUIET_S)
        assert sweeps.sweep(gdeps).slept == [made[-1][1]]
    for handle, vm_id, _ in made:  # each in turn: the others quiet again, asleep
        assert _exec(gdeps, handle, vm_id) == "exited"
        assert _status(gdeps, vm_id) == "running"
        clock.advance(QUIET_S)
        assert sweeps.sweep(gdeps).slept == [vm_id]
    assert {_status(gdeps, vm_id) for _, vm_id, _ in made} == {"sleeping"}
    for handle, vm_id, _ in made[:3]:  # three awake at once, ...
        assert _exec(gdeps, handle, vm_id) == "exited"
    refused("no_capacity", lambda: _exec(gdeps, made[3][0], made[3][1]))  # ... a fourth not


def test_racing_calls_wake_a_vm_once(gdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    clock.advance(QUIET_S)
    assert sweeps.sweep(gdeps).slept == [vm_id]
    answers: list[str] = []
    go = threading.Barrier(8)

    def call() -> None:
        go.wait()
        answers.append(_exec(gdeps, handle, vm_id))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers == ["exited"] * 8
    assert event_types(gdeps, task_id).count("vm_woke") == 1


def test_a_paused_vm_is_not_woken_and_a_pause_of_a_sleeping_one_saves_nothing(
        gdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    clock.advance(QUIET_S)
    sweeps.sweep(gdeps)
    held = command(c.VmHeldIn, handle=handle, vm_id=vm_id)
    assert pauses.pause(gdeps, ALICE, held).vm.status == "paused"
    domain = local_hv.domains[f"rift-{vm_id}"]
    assert (domain.active, domain.saved) == (False, True)
    assert event_types(gdeps, task_id)[-2:] == ["vm_slept", "vm_paused"]
    refused("vm_not_running", lambda: _exec(gdeps, handle, vm_id))
    assert pauses.resume(gdeps, ALICE, held).vm.status == "running"


def test_resume_wakes_a_sleeping_vm(gdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    clock.advance(QUIET_S)
    sweeps.sweep(gdeps)
    held = command(c.VmHeldIn, handle=handle, vm_id=vm_id)
    assert pauses.resume(gdeps, ALICE, held).vm.status == "running"
    assert event_types(gdeps, task_id)[-1] == "vm_woke"


def test_a_destroy_of_a_sleeping_vm_destroys_it_without_waking_it(
        gdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor, life: FakeLifecycle) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    clock.advance(QUIET_S)
    sweeps.sweep(gdeps)
    gone = vms.destroy(gdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=vm_id)).vm
    assert gone.status == "destroyed" and f"rift-{vm_id}" not in local_hv.domains
    assert ("resumed", vm_id) not in life.calls
    assert "vm_woke" not in event_types(gdeps, task_id)


def test_a_wake_that_fails_answers_guest_unreachable_and_leaves_nothing_running(
        gdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    clock.advance(QUIET_S)
    sweeps.sweep(gdeps)
    local_hv.domains[f"rift-{vm_id}"].saved = False  # its saved state is lost
    err = refused("guest_unreachable", lambda: _exec(gdeps, handle, vm_id))
    assert "wake failed" in err.message and "saved state" in err.message
    vm = vms.get(gdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert vm.status == "failed" and vm.error is not None
    assert f"rift-{vm_id}" not in local_hv.domains
    assert event_types(gdeps, task_id)[-1] == "vm_failed"


def test_a_sleep_refused_by_libvirt_leaves_the_vm_running(
        gdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    _, vm_id, _ = _vm(gdeps)
    local_hv.domains[f"rift-{vm_id}"].active = False  # the save finds no running domain
    clock.advance(QUIET_S)
    assert sweeps.sleep_quiet(gdeps) == []
    with gdeps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    assert vm is not None and (vm.status, vm.change) == ("running", None)


@pytest.mark.parametrize(("status", "change", "active", "settled"), [
    ("running", "falling_asleep", False, "sleeping"),
    ("running", "falling_asleep", True, "running"),
    ("sleeping", "waking", True, "running"),
    ("sleeping", "waking", False, "sleeping"),
])
def test_a_sleep_or_wake_a_crash_cut_short_is_settled_by_what_the_host_shows(
        gdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor, status: str, change: str,
        active: bool, settled: str) -> None:
    _, vm_id, _ = _vm(gdeps)
    domain = local_hv.domains[f"rift-{vm_id}"]
    domain.active, domain.saved = active, not active
    with gdeps.store.write() as tx:
        leave_cut_change(tx, vm_id, status, change, clock.now())  # type: ignore[arg-type]
    clock.advance(gdeps.limits.creating_grace_s + 1)
    reconcile.reconcile(gdeps)
    with gdeps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    assert vm is not None and (vm.status, vm.change) == (settled, None)
    assert (domain.active, domain.saved) == (active, not active)


def test_a_sleeping_vm_whose_domain_was_started_outside_rift_runs_again(
        gdeps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    _, vm_id, task_id = _vm(gdeps)
    clock.advance(QUIET_S)
    sweeps.sweep(gdeps)
    local_hv.restore(f"rift-{vm_id}")  # `virsh start`
    reconcile.reconcile(gdeps)
    assert _status(gdeps, vm_id) == "running"
    assert event_types(gdeps, task_id)[-1] == "vm_woke"


def test_the_boxes_page_shows_a_sleeping_vm_and_what_it_holds_awake_without_waking_it(
        gdeps: Deps, clock: FakeClock, life: FakeLifecycle) -> None:
    from rift.services.read import boxes
    from web.render import live_region

    _, vm_id, _ = _vm(gdeps, memory_mib=512)
    clock.advance(QUIET_S)
    sweeps.sweep(gdeps)
    html = live_region(boxes.read_page(gdeps, ALICE.user), clock.now(),
                       {"mcp_url": "http://rift.test/mcp"})
    row = html[html.index(f'data-vm="{vm_id}"'):]
    assert 'class="status s-sleeping"' in row[:600]
    assert "asleep · 1 vCPU, 512 MiB awake" in row
    assert _status(gdeps, vm_id) == "sleeping" and ("resumed", vm_id) not in life.calls


def test_sleep_vm_puts_a_vm_to_sleep_now_with_its_execs_and_the_next_call_wakes_it(
        gdeps: Deps, local_hv: FakeHypervisor) -> None:
    from rift.services.lifecycle import sleeps

    handle, vm_id, task_id = _vm(gdeps)
    assert _exec(gdeps, handle, vm_id, "make", wait_s=0) == "running"
    assert sleeps.sleep_vm(gdeps, vm_id, "e2b:timeout", "its sandbox's end (autoPause)")
    assert not sleeps.sleep_vm(gdeps, vm_id, "e2b:timeout", "again")  # asleep already
    with gdeps.store.read() as tx:
        slept = [e for e in tx.events.page(task_id, 0, 100) if e.type == "vm_slept"]
    assert [(e.actor, e.details["reason"]) for e in slept] == \
        [("e2b:timeout", "its sandbox's end (autoPause)")]
    assert _exec(gdeps, handle, vm_id) == "exited"


def test_a_host_short_of_disk_puts_nothing_to_sleep(gdeps: Deps, clock: FakeClock) -> None:
    _, vm_id, _ = _vm(gdeps)
    gdeps.disk_room.free["local"] = 1  # under RIFT_HOST_DISK_RESERVE_GIB
    clock.advance(QUIET_S)
    assert sweeps.sweep(gdeps).slept == [] and _status(gdeps, vm_id) == "running"


def test_a_slow_wake_by_a_request_to_an_exposure_moves_no_task_clock(
        gdeps: Deps, clock: FakeClock, life: FakeLifecycle,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Unlike a call's wake, a request's is no call in flight: anyone who holds the
    URL could else keep the task from its idle close by waking it again and again."""
    from rift.services.lifecycle.sleeps import wake

    gdeps = replace(gdeps, lease_rules=replace(gdeps.lease_rules, activity_step_s=1))
    _, vm_id, task_id = _vm(gdeps, sleep_after_s=2)
    clock.advance(4)
    assert sweeps.sweep(gdeps).slept == [vm_id]
    closes_at, quick = task_now(gdeps, task_id).closes_at, life.resumed

    def slow_resume(vm: object, timeout_s: float, **how: object) -> None:
        for _ in range(3):  # three steps of the clock pass while the guest restores
            clock.advance(1)
            time.sleep(0.6)
        quick(vm, timeout_s, **how)  # type: ignore[arg-type]

    monkeypatch.setattr(life, "resumed", slow_resume)
    wake(gdeps, vm_id, "exposure", woken_by="exposure")
    assert _status(gdeps, vm_id) == "running"
    assert task_now(gdeps, task_id).closes_at == closes_at


def test_a_vm_woken_by_a_request_to_its_exposure_stays_awake_its_sleep_time(
        gdeps: Deps, clock: FakeClock) -> None:
    """Such a request wakes the VM and moves no task clock (it is no call under the
    handle): the next sweep must not put the VM to sleep again under the request (it
    did: the request, mid-answer, got 502); it sleeps once quiet that long again."""
    from rift.services.lifecycle.sleeps import wake

    _, vm_id, _ = _vm(gdeps)
    clock.advance(QUIET_S)
    assert sweeps.sweep(gdeps).slept == [vm_id]
    clock.advance(3600)  # the task quiet for an hour (before its idle close)
    wake(gdeps, vm_id, "exposure", woken_by="exposure")
    assert _status(gdeps, vm_id) == "running"
    clock.advance(1)
    assert sweeps.sweep(gdeps).slept == [] and _status(gdeps, vm_id) == "running"
    clock.advance(QUIET_S - 1)
    assert sweeps.sweep(gdeps).slept == [vm_id]
