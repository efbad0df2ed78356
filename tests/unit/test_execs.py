"""Execs in the engine (SPEC §10), over a fake guest (tests/support/fake_guest.py)
and the real store: the record before the start, the end once with its event,
offsets and the ring's truncation, input and kill, lists, one answer for unknown
and foreign ids, stale handles, lost execs (a VM destroyed, a guest that forgot),
the sweep recording ends, and a call in flight keeping its lease active."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import sweeps
from rift.services.context import Deps
from rift.services.lifecycle import execs, leases, tasks, vms
from rift.services.ports.watch import STEP_S, Watch, newest_line
from rift.services.read.views import task_now
from tests.support.engine import ALICE, BOB, event_types, refused
from tests.support.fake_guest import FakeExecs, fake_guests
from tests.support.vm_rows import give_ssh_address


@pytest.fixture
def shell() -> FakeExecs:
    return FakeExecs()


@pytest.fixture
def gdeps(deps: Deps, shell: FakeExecs) -> Deps:
    return replace(deps, guests=fake_guests(execs=shell))


def _vm(deps: Deps) -> tuple[str, str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id, opened.task.id


def test_an_exec_that_ends_within_its_wait_answers_its_end_and_is_recorded_once(
        gdeps: Deps) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
              command="echo hello"))
    assert (out.status, out.exit_code, out.stdout, out.stdout_offset, out.stdout_bytes) == \
        ("exited", 0, "hello\n", 6, 6)
    assert out.exec_id.startswith("exec_") and out.duration_ms == 250
    assert out.ended_at is not None and not out.truncated
    again = execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id))
    assert (again.status, again.stdout) == ("exited", "hello\n")
    types = event_types(gdeps, task_id)
    assert types.count("exec_started") == 1 and types.count("exec_ended") == 1
    with gdeps.store.read() as tx:
        ended = next(e for e in tx.events.page(task_id, 0, 100) if e.type == "exec_ended")
    assert ended.details == {"exec_id": out.exec_id, "vm_id": vm_id, "status": "exited",
                             "exit_code": 0}


def test_a_running_exec_is_read_on_from_its_offsets(gdeps: Deps, shell: FakeExecs) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="make",
              wait_s=0))
    assert out.status == "running" and out.exit_code is None and shell.waits == [0]
    assert task_now(gdeps, task_id).running_execs == 1
    shell.write(out.exec_id, b"line 1\n", b"warn\n")
    first = execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id,
                wait_s=5))
    assert (first.stdout, first.stderr, first.stdout_offset, first.stderr_offset) == \
        ("line 1\n", "warn\n", 7, 5)
    assert shell.waits[-1] == 5000
    shell.write(out.exec_id, b"line 2\n")
    shell.finish(out.exec_id, 2)
    rest = execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id,
               stdout_offset=first.stdout_offset, stderr_offset=first.stderr_offset))
    assert (rest.status, rest.exit_code, rest.stdout, rest.stderr, rest.stdout_bytes) == \
        ("exited", 2, "line 2\n", "", 14)
    assert task_now(gdeps, task_id).running_execs == 0
    err = refused("invalid_argument", lambda: execs.get(gdeps, ALICE, command(c.VmExecGetIn,
                                          handle=handle, exec_id=out.exec_id, stdout_offset=15)))
    assert err.details["field"] == "stdout_offset"


def test_a_read_from_before_the_ring_starts_at_the_oldest_byte_kept(
        gdeps: Deps, shell: FakeExecs) -> None:
    shell.cap = 10
    handle, vm_id, _ = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="yes",
              wait_s=0))
    shell.write(out.exec_id, b"0123456789abcdef")
    view = execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id))
    assert (view.stdout, view.stdout_offset, view.stdout_bytes, view.truncated) == \
        ("6789abcdef", 16, 16, True)


def test_input_reaches_stdin_until_eof_and_an_ended_exec_takes_none(
        gdeps: Deps, shell: FakeExecs) -> None:
    handle, vm_id, _ = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
              command="python3", wait_s=0))
    assert execs.send_input(gdeps, ALICE, command(c.VmExecInputIn, handle=handle,
               exec_id=out.exec_id, data="print(1)\n")).bytes == 9
    assert execs.send_input(gdeps, ALICE, command(c.VmExecInputIn, handle=handle,
               exec_id=out.exec_id, data="AAE=", encoding="base64", eof=True)).bytes == 2
    assert shell.execs[out.exec_id].stdin == b"print(1)\n\x00\x01"
    err = refused("invalid_argument", lambda: execs.send_input(gdeps, ALICE, command(
                                          c.VmExecInputIn, handle=handle, exec_id=out.exec_id,
                                          data="x")))
    assert err.details["field"] == "eof"
    shell.finish(out.exec_id)
    err = refused("invalid_argument", lambda: execs.send_input(gdeps, ALICE, command(
                                          c.VmExecInputIn, handle=handle, exec_id=out.exec_id,
                                          data="x")))
    assert "ended" in err.message
    assert execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle,
               exec_id=out.exec_id)).status == "exited"
    refused("invalid_argument", lambda: execs.send_input(gdeps, ALICE, command(c.VmExecInputIn,
                                    handle=handle, exec_id=out.exec_id, data="!",
                                    encoding="base64")))


def test_a_kill_ends_the_exec_killed_and_a_repeat_changes_nothing(
        gdeps: Deps, shell: FakeExecs) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
              command="sleep 100", wait_s=0))
    killed = execs.kill(gdeps, ALICE, command(c.VmExecKillIn, handle=handle, exec_id=out.exec_id))
    assert (killed.status, killed.signal, killed.exit_code) == ("killed", "TERM", None)
    again = execs.kill(gdeps, ALICE, command(c.VmExecKillIn, handle=handle, exec_id=out.exec_id,
                signal="KILL"))
    assert again == killed
    assert event_types(gdeps, task_id).count("exec_ended") == 1
    err = refused("invalid_argument", lambda: execs.kill(gdeps, ALICE, command(c.VmExecKillIn,
                                          handle=handle, exec_id=out.exec_id, signal="HUP")))
    assert err.details["field"] == "signal"


def test_a_timeout_in_the_guest_ends_the_exec_timed_out(gdeps: Deps, shell: FakeExecs) -> None:
    handle, vm_id, _ = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
              command="sleep 100", timeout_s=1, wait_s=0))
    shell.finish(out.exec_id, None, 15, timed_out=True)
    view = execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id))
    assert (view.status, view.timed_out, view.signal) == ("timed_out", True, "TERM")


def test_lists_show_running_execs_or_all_without_output(gdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id, _ = _vm(gdeps)
    done = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
               command="echo hi"))
    clock.advance(1)
    running = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                  command="serve", wait_s=0))
    listed = execs.list_execs(gdeps, ALICE, command(c.VmExecListIn, handle=handle))
    assert [e.exec_id for e in listed.execs] == [running.exec_id]
    every = execs.list_execs(gdeps, ALICE, command(c.VmExecListIn, handle=handle, vm_id=vm_id,
                status="all"))
    assert [e.exec_id for e in every.execs] == [done.exec_id, running.exec_id]
    assert all(e.stdout == "" for e in every.execs) and every.execs[0].command == "echo hi"
    refused("invalid_argument", lambda: execs.list_execs(gdeps, ALICE, command(c.VmExecListIn,
                                    handle=handle, vm_id=None, status="ended")))
    refused("vm_not_found", lambda: execs.list_execs(gdeps, ALICE, command(c.VmExecListIn,
                                handle=handle, vm_id="vm_aaaaaaaa")))


def test_unknown_and_foreign_exec_ids_get_one_answer_and_a_stale_handle_is_refused(
        gdeps: Deps) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="serve",
              wait_s=0))
    other = tasks.new(gdeps, ALICE, command(c.TaskNewIn))
    foreign = refused("exec_not_found", lambda: execs.get(gdeps, ALICE, command(c.VmExecGetIn,
                                            handle=str(other.handle), exec_id=out.exec_id)))
    unknown = refused("exec_not_found", lambda: execs.get(gdeps, ALICE, command(c.VmExecGetIn,
                                            handle=str(other.handle), exec_id="exec_aaaaaaaa")))
    assert foreign.hint == unknown.hint and "rift_vm_exec_list" in foreign.hint
    bobs = tasks.new(gdeps, BOB, command(c.TaskNewIn))
    refused("exec_not_found", lambda: execs.kill(gdeps, BOB, command(c.VmExecKillIn,
                                  handle=str(bobs.handle), exec_id=out.exec_id)))
    refused("invalid_argument", lambda: execs.get(gdeps, ALICE, command(c.VmExecGetIn,
                                    handle=handle, exec_id="exec_1")))
    leases.attach(gdeps, ALICE, command(c.TaskAttachIn, task_id=task_id, takeover=True))
    for call, model, fields in ((execs.get, c.VmExecGetIn, {}), (execs.kill, c.VmExecKillIn, {}),
                                (execs.send_input, c.VmExecInputIn, {"data": "x"})):
        refused("lease_stale", call, gdeps, ALICE,
                model(handle=handle, exec_id=out.exec_id, **fields))
    assert event_types(gdeps, task_id).count("stale_rejected") == 3


def test_an_exec_of_a_destroyed_vm_ends_lost(gdeps: Deps) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="serve",
              wait_s=0))
    vms.destroy(gdeps, ALICE, command(c.VmDestroyIn, vm_id=vm_id, handle=handle))
    view = execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id))
    assert view.status == "lost" and view.ended_at is not None
    assert event_types(gdeps, task_id).count("exec_ended") == 1


def test_the_sweep_records_ends_and_execs_the_guest_forgot(
        gdeps: Deps, shell: FakeExecs, clock: FakeClock) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    ended = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                command="build", wait_s=0))
    forgotten = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                    command="serve", wait_s=0))
    still = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                command="train", wait_s=0))
    shell.finish(ended.exec_id, 0)
    shell.forget(forgotten.exec_id)  # the guest rebooted
    # Not known to the guest yet may mean not started yet: lost only past the grace.
    assert sweeps.sweep(gdeps).execs_ended == [ended.exec_id]
    clock.advance(gdeps.limits.creating_grace_s)
    report = sweeps.sweep(gdeps)
    assert report.execs_ended == [forgotten.exec_id]
    with gdeps.store.read() as tx:
        statuses = {e.id: e.status for e in tx.execs.of_task(task_id)}
    assert statuses == {ended.exec_id: "exited", forgotten.exec_id: "lost",
                        still.exec_id: "running"}
    assert sweeps.sweep(gdeps).execs_ended == []


def test_the_sweep_leaves_an_exec_to_the_call_that_waits_on_it(
        gdeps: Deps, shell: FakeExecs) -> None:
    """A sweep that came while an exec's own call waited on its guest read it too,
    on a second connection (a new login, in a guest just woken: the call's command
    then shared the guest's CPU with the login). It leaves such execs to their call,
    which records their end; once no call waits, it looks at them again."""
    handle, vm_id, _ = _vm(gdeps)
    reads: list[str] = []
    real_read = shell.exec_read

    def counted(vm: object, read: object) -> object:
        reads.append(read.exec_id)  # type: ignore[attr-defined]
        return real_read(vm, read)  # type: ignore[arg-type]

    shell.exec_read = counted  # type: ignore[method-assign,assignment]
    during: list[list[str]] = []

    def sweep_meanwhile(exec_id: str, wait_ms: int) -> None:
        if not during:
            during.append(sweeps.sweep(gdeps).execs_ended)
            during.append(list(reads))
            shell.finish(exec_id)

    shell.on_wait = sweep_meanwhile
    started = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                          command="make", wait_s=1))
    assert during == [[], []]  # the sweep asked the guest nothing while the start waited
    assert started.status == "exited"

    shell.on_wait = None
    background = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                             command="serve", wait_s=0))
    shell.finish(background.exec_id)
    assert sweeps.sweep(gdeps).execs_ended == [background.exec_id]  # no call waits on it
    assert reads == [background.exec_id]


def test_an_unreachable_guest_records_no_exec(deps: Deps) -> None:
    handle, vm_id, task_id = _vm(deps)  # deps has no guest shell
    refused("guest_unreachable", lambda: execs.start(deps, ALICE, command(c.VmExecIn, handle=handle,
                                     vm_id=vm_id, command="true")))
    assert "exec_started" not in event_types(deps, task_id)


def test_a_call_waiting_on_its_guest_keeps_the_lease_active(
        gdeps: Deps, clock: FakeClock, shell: FakeExecs) -> None:
    """While a long poll waits, the task's activity clock moves at its step."""
    gdeps = replace(gdeps, lease_rules=replace(gdeps.lease_rules, activity_step_s=1))
    handle, vm_id, task_id = _vm(gdeps)
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="train",
              wait_s=0))
    before = task_now(gdeps, task_id).last_activity_at
    reading = threading.Event()

    def slow_read(*args: object, **kwargs: object) -> object:
        reading.set()
        for _ in range(4):  # four steps of the clock pass while the call waits
            clock.advance(timedelta(seconds=1).total_seconds())
            time.sleep(0.6)
        return FakeExecs._view(shell, out.exec_id, 0, 0, 100)

    shell.exec_read = slow_read  # type: ignore[method-assign]
    execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id, wait_s=10))
    assert reading.is_set()
    assert task_now(gdeps, task_id).last_activity_at > before


def test_a_watched_exec_waits_in_steps_noting_its_newest_line(
        gdeps: Deps, shell: FakeExecs) -> None:
    """A door watching a call hears of the exec and of its newest output line at
    each step (at most STEP_S), and gets the view from the start at the end."""
    handle, vm_id, _ = _vm(gdeps)
    watch = Watch()
    steps: list[int] = []

    def guest(exec_id: str, wait_ms: int) -> None:
        steps.append(wait_ms)
        if len(steps) == 1:
            shell.write(exec_id, b"compiling a.c\ncompiling b.c\n")
        else:
            assert watch.message == "compiling b.c" and watch.target == exec_id
            shell.write(exec_id, b"linked\n")
            shell.finish(exec_id)

    shell.on_wait = guest
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="make",
              wait_s=60), watch)
    assert (out.status, out.stdout) == ("exited", "compiling a.c\ncompiling b.c\nlinked\n")
    assert steps == [int(STEP_S * 1000)] * 2
    assert watch.status().endswith("s: compiling b.c")


def test_a_stopped_watch_ends_the_wait_within_a_step(gdeps: Deps, shell: FakeExecs) -> None:
    handle, vm_id, _ = _vm(gdeps)
    watch = Watch()
    shell.on_wait = lambda exec_id, wait_ms: watch.stop()
    out = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="make",
              wait_s=600), watch)
    assert out.status == "running" and len(shell.waits) <= 3  # no wait after the stop
    polls: list[int] = []

    def quiet_then_news(exec_id: str, wait_ms: int) -> None:
        polls.append(wait_ms)
        if len(polls) == 3:
            shell.write(exec_id, b"epoch 1\n")

    shell.on_wait = quiet_then_news
    got = execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=out.exec_id,
              wait_s=60), Watch())
    assert got.stdout == "epoch 1\n" and polls == [int(STEP_S * 1000)] * 3


def test_a_watched_vm_new_names_its_vm_and_its_stage(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    watch = Watch()
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle)), watch).vm
    assert watch.target == vm.id and watch.message == f"{vm.id}: booting"


def test_the_newest_line_is_the_last_with_text() -> None:
    assert newest_line(b"a\nb\n\n  \n") == "b"
    assert newest_line(b"50%\r60%\r") == "60%"
    assert newest_line(b"\xff\xfeok") == "\ufffd\ufffdok"
    assert newest_line(b"") == ""
