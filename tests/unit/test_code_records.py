"""The engine's record of a VM's code contexts (SPEC §20, table code_contexts): the
VM view's `code_contexts` (language, last run, the run in flight) as contexts are
made, run, restarted, listed and deleted, over the real rift-code run on this host
(tests/support/code_guest.py) and the real store; gone with the VM."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock, iso
from rift.domain.code_contexts import CodeContext
from rift.services.context import Deps
from rift.services.lifecycle import code, forks, snapshots, vms
from tests.support.code_guest import HostCode, code_vm, run_code
from tests.support.engine import ALICE
from tests.support.fake_guest import fake_guests


@pytest.fixture
def cdeps(deps: Deps, tmp_path: Path) -> Iterator[Deps]:
    guest = HostCode(tmp_path)  # a server of its own: the list below is this VM's
    yield replace(deps, guests=fake_guests(), code=guest)
    guest.close()


def _contexts(deps: Deps, vm_id: str) -> dict[str, c.VmCodeContextView]:
    view = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    return {x.id: x for x in view.code_contexts}


def test_the_vm_view_lists_its_contexts_as_they_are_made_run_restarted_and_deleted(
        cdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id = code_vm(cdeps)
    assert _contexts(cdeps, vm_id) == {}
    first = run_code(cdeps, handle, vm_id, "x = 1\nx").execution
    shown = _contexts(cdeps, vm_id)["default"]
    assert (shown.language, shown.last_status, shown.execution_count, shown.running) == (
        "python", "ok", first.execution_count, None)
    assert shown.last_run_at == iso(clock.now())
    made = code.new_context(cdeps, ALICE, command(c.VmCodeContextNewIn, handle=handle,
                                                  vm_id=vm_id, cwd="/tmp")).context
    fresh = _contexts(cdeps, vm_id)[made.id]
    assert (fresh.cwd, fresh.last_run_at, fresh.execution_count) == ("/tmp", None, None)
    clock.advance(5)
    run_code(cdeps, handle, vm_id, "1/0", context_id=made.id)
    failed = _contexts(cdeps, vm_id)[made.id]
    assert (failed.last_status, failed.execution_count, failed.last_run_at) == (
        "error", 1, iso(clock.now()))
    slow = run_code(cdeps, handle, vm_id, "import time\ntime.sleep(0.3)", context_id=made.id,
                wait_s=0).execution
    assert _contexts(cdeps, vm_id)[made.id].running == slow.run_id
    code.get_run(cdeps, ALICE, command(c.VmRunCodeGetIn, handle=handle, vm_id=vm_id,
                                       run_id=slow.run_id, wait_s=10))
    assert _contexts(cdeps, vm_id)[made.id].running is None  # its end, read
    code.restart(cdeps, ALICE, command(c.VmCodeContextIn, handle=handle, vm_id=vm_id,
                                       context_id=made.id))
    restarted = _contexts(cdeps, vm_id)[made.id]
    assert (restarted.execution_count, restarted.last_status) == (None, None)
    code.delete(cdeps, ALICE, command(c.VmCodeContextIn, handle=handle, vm_id=vm_id,
                                      context_id=made.id))
    assert made.id not in _contexts(cdeps, vm_id)
    with cdeps.store.write() as tx:  # a row the guest does not have (a reboot ended it)
        tx.code_contexts.put(CodeContext(vm_id=vm_id, id="ctx_gonegone", task_id="task_x",
                                         language="python", cwd=None, created_at=clock.now()))
    code.list_contexts(cdeps, ALICE, command(c.VmCodeContextListIn, handle=handle,
                                             vm_id=vm_id))
    assert "ctx_gonegone" not in _contexts(cdeps, vm_id) and "default" in _contexts(
        cdeps, vm_id)
    vms.destroy(cdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=vm_id))
    with cdeps.store.read() as tx:
        assert tx.code_contexts.of_vms([vm_id]) == {vm_id: []}


def test_a_fork_of_a_running_vm_lists_its_sources_contexts_at_once(
        cdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id = code_vm(cdeps)
    run_code(cdeps, handle, vm_id, "x = 1\nx")
    made = code.new_context(cdeps, ALICE, command(c.VmCodeContextNewIn, handle=handle,
                                                  vm_id=vm_id, cwd="/tmp")).context
    clock.advance(5)
    run_code(cdeps, handle, vm_id, "1/0", context_id=made.id)
    source = _contexts(cdeps, vm_id)
    [fork] = forks.fork(cdeps, ALICE, command(c.VmForkIn, handle=handle, vm_id=vm_id)).vms
    assert {x.id: x for x in fork.code_contexts} == source  # in its first answer, too
    assert _contexts(cdeps, fork.id) == source  # no run or list in the fork before
    assert (source[made.id].cwd, source[made.id].last_status) == ("/tmp", "error")
    vms.destroy(cdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=fork.id))
    assert _contexts(cdeps, vm_id) == source  # the source's rows are its own


def test_a_fork_of_a_snapshot_lists_the_contexts_its_source_had_then_at_once(
        cdeps: Deps, clock: FakeClock) -> None:
    handle, vm_id = code_vm(cdeps)
    run_code(cdeps, handle, vm_id, "x = 1\nx")
    kept = code.new_context(cdeps, ALICE, command(c.VmCodeContextNewIn, handle=handle,
                                                  vm_id=vm_id, cwd="/tmp")).context
    clock.advance(5)
    before = _contexts(cdeps, vm_id)
    snap = snapshots.make(cdeps, ALICE, command(c.VmSnapshotIn, handle=handle,
                                                vm_id=vm_id)).snapshot
    clock.advance(5)
    later = code.new_context(cdeps, ALICE, command(c.VmCodeContextNewIn, handle=handle,
                                                   vm_id=vm_id)).context
    run_code(cdeps, handle, vm_id, "x + 1")  # the default context's run after the snapshot
    [fork] = forks.fork(cdeps, ALICE, command(c.VmForkIn, handle=handle,
                                              snapshot_id=snap.id)).vms
    shown = {x.id: x for x in fork.code_contexts}
    assert shown == _contexts(cdeps, fork.id)  # its first answer and its view, no run before
    assert set(shown) == {"default", kept.id} and later.id not in shown
    assert shown[kept.id] == before[kept.id]  # as the source had it then
    # The source's default context ran since: that run is not the fork's.
    assert (shown["default"].last_run_at, shown["default"].execution_count) == (None, None)
    assert before["default"].execution_count == 1
    vms.destroy(cdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=fork.id))
    vms.destroy(cdeps, ALICE, command(c.VmDestroyIn, handle=handle, vm_id=vm_id))
    fresh = forks.fork(cdeps, ALICE, command(c.VmForkIn, handle=handle,
                                             snapshot_id=snap.id)).vms[0]
    assert fresh.code_contexts == []  # the source gone: its first run or list finds them
