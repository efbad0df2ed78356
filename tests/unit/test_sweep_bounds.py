"""The sweep's guest work is bounded per VM (SPEC §15): a guest that stalls or does
not answer costs its own VM's share of a run, other VMs' execs are looked at
meanwhile, and the scan of running execs rotates so no exec is always left out."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.errors import GuestUnreachable
from rift.domain.model import Vm
from rift.services.background.bounded import per_vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle import exec_ends, execs, tasks, vms
from rift.services.ports import ExecRead, GuestExec
from tests.support.engine import ALICE, BOB
from tests.support.fake_guest import FakeExecs, fake_guests
from tests.support.vm_rows import give_ssh_address


@dataclass
class StallingShell(FakeExecs):
    """A fake guest where one VM's reads stall, then fail as unreachable."""

    stalled_vm: str | None = None
    stall_s: float = 0.3
    asked: list[str] = field(default_factory=list)
    deadlines: list[float | None] = field(default_factory=list)

    def exec_read(self, vm: Vm, read: ExecRead) -> GuestExec:
        self.asked.append(read.exec_id)
        self.deadlines.append(read.deadline_s)
        if vm.id == self.stalled_vm:
            time.sleep(self.stall_s)
            raise GuestUnreachable(vm.id, "timed out")
        return super().exec_read(vm, read)


def _running_vm(deps: Deps, caller: Caller) -> tuple[str, str]:
    opened = tasks.new(deps, caller, command(c.TaskNewIn))
    vm = vms.new(deps, caller, command(c.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id


def test_a_guest_that_stalls_is_asked_once_and_other_vms_ends_are_recorded(
        deps: Deps) -> None:
    shell = StallingShell()
    gdeps = replace(deps, guests=fake_guests(execs=shell))
    hostile_handle, hostile = _running_vm(gdeps, ALICE)
    fair_handle, fair = _running_vm(gdeps, BOB)
    stalled = [execs.start(gdeps, ALICE, command(c.VmExecIn, handle=hostile_handle, vm_id=hostile,
                   command=f"job{i}", wait_s=0)).exec_id
               for i in range(3)]
    done = execs.start(gdeps, BOB, command(c.VmExecIn, handle=fair_handle, vm_id=fair,
               command="build", wait_s=0)).exec_id
    shell.finish(done, 0)
    shell.stalled_vm = hostile
    assert exec_ends.record_ends(gdeps) == [done]
    assert sum(1 for exec_id in shell.asked if exec_id in stalled) == 1
    # Each look is given a short deadline of its own, never the helper's long slack.
    assert all(d is not None and 0 < d <= exec_ends.SWEEP_CALL_S for d in shell.deadlines)


def test_each_vm_works_within_its_budget_and_vms_do_not_wait_on_each_other() -> None:
    finished: dict[str, float] = {}
    began = time.monotonic()
    lock = threading.Lock()

    def work(item: tuple[str, float], left_s: float) -> str:
        assert 0 < left_s <= 0.5
        vm_id, seconds = item
        time.sleep(seconds)
        with lock:
            finished[vm_id] = time.monotonic() - began
        return vm_id

    answers = per_vm({"slow": [("slow", 0.2)] * 10, "quick": [("quick", 0.01)] * 3},
                     work, budget_s=0.5)
    assert answers.count("quick") == 3
    assert 2 <= answers.count("slow") <= 4  # cut at its budget, not its ten items
    assert finished["quick"] < 0.2  # not behind the slow VM's first item


def test_the_exec_scan_rotates_through_every_running_exec(deps: Deps) -> None:
    shell = StallingShell()
    gdeps = replace(deps, guests=fake_guests(execs=shell))
    handle, vm_id = _running_vm(gdeps, ALICE)
    started = sorted(execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                         command=f"job{i}", wait_s=0)).exec_id
                     for i in range(3))
    seen = []
    for _ in range(3):
        shell.asked.clear()
        exec_ends.record_ends(gdeps, limit=2)
        seen.append(list(shell.asked))
    assert seen == [started[:2], started[2:], started[:2]]
