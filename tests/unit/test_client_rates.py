"""What a client can make happen, rate-limited like VM creation (SPEC §15): exec
starts per user per hour, and the events stale handles leave per task per hour.
The engine on a fake guest and the real store, with a fake clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.context import Deps
from rift.services.lifecycle import execs, leases, tasks, vms
from tests.support.engine import ALICE, BOB, event_types, refused
from tests.support.fake_guest import fake_guests
from tests.support.vm_rows import give_ssh_address


def _engine(make_deps: Callable[..., Deps], **limits: int) -> Deps:
    return replace(make_deps(**limits), guests=fake_guests())


def _vm(deps: Deps, caller: object = ALICE) -> tuple[str, str, str]:
    opened = tasks.new(deps, caller, command(c.TaskNewIn))  # type: ignore[arg-type]
    vm = vms.new(deps, caller, command(c.VmNewIn,
             handle=str(opened.handle))).vm  # type: ignore[arg-type]
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id, opened.task.id


def test_exec_starts_are_rate_limited_per_user_per_hour(
        make_deps: Callable[..., Deps], clock: FakeClock) -> None:
    deps = _engine(make_deps, rate_exec_new_per_h=3)
    handle, vm_id, task_id = _vm(deps)
    for _ in range(3):
        assert execs.start(deps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                   command="echo hi")).status == "exited"
        clock.advance(600)
    err = refused("rate_limited", lambda: execs.start(deps, ALICE, command(c.VmExecIn,
                                      handle=handle, vm_id=vm_id, command="echo hi")))
    # the oldest start leaves the window 30 minutes on
    assert 29 * 60 < err.details["retry_after_s"] <= 30 * 60 + 1
    assert "3 exec starts" in err.message
    assert event_types(deps, task_id).count("exec_started") == 3  # the refusal wrote nothing
    # another user's budget is their own
    other_handle, other_vm, _ = _vm(deps, BOB)
    assert execs.start(deps, BOB, command(c.VmExecIn, handle=other_handle, vm_id=other_vm,
               command="echo hi")).status == "exited"
    clock.advance(31 * 60)
    assert execs.start(deps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
               command="echo hi")).status == "exited"


def test_stale_handles_leave_events_within_a_budget_then_are_refused_without_one(
        make_deps: Callable[..., Deps], clock: FakeClock) -> None:
    deps = _engine(make_deps, rate_stale_per_h=2)
    handle, vm_id, task_id = _vm(deps)
    taken = leases.attach(deps, ALICE, command(c.TaskAttachIn, task_id=task_id, takeover=True))
    assert str(taken.handle) != handle
    refused("lease_stale", leases.hold, deps, ALICE, handle)
    clock.advance(1)
    refused("lease_stale", lambda: execs.start(deps, ALICE, command(c.VmExecIn, handle=handle,
                               vm_id=vm_id, command="echo hi")))
    assert event_types(deps, task_id).count("stale_rejected") == 2
    err = refused("rate_limited", leases.hold, deps, ALICE, handle)
    assert "stale-handle refusals" in err.message
    assert event_types(deps, task_id).count("stale_rejected") == 2
    # the holder is not slowed: its own calls go on
    assert execs.start(deps, ALICE, command(c.VmExecIn, handle=str(taken.handle), vm_id=vm_id,
               command="echo hi")).status == "exited"
    clock.advance(3600)
    refused("lease_stale", leases.hold, deps, ALICE, handle)
    assert event_types(deps, task_id).count("stale_rejected") == 3
