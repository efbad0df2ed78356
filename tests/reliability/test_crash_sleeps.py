"""Crashes amid sleep and wake (issue 29, SPEC §17), in the crash campaign: `kill -9`
of `rift serve` while the sweep saves a quiet task's `tiny` guest (its row
`running`, `falling_asleep`) and while a call wakes it (`sleeping`, `waking`),
then a restart on the same data dir with a short creating grace, so that the
sweep's reconciliation judges the cut change soon (as tests/e2e/test_real_pause.py
does for a cut pause). Once it has: no VM is both asleep and awake (a `sleeping`
row's domain stopped with its saved state, a `running` row's domain running), no
domain of the installation lacks a live row, the VM's last sleep or wake event
says what its row says, and the VM answers its next exec (woken if it sleeps).
Each kill comes a random few hundred milliseconds into the change (the seed is
printed; `RIFT_CRASH_SEED=N` replays it); how many kills found the change still
under way is recorded.

The task sleeps after 1 s, so the sweep may begin a new sleep of the VM at any
moment after the cut one is settled: the checks read the rows, the domains and
the rows again, and judge only a reading in which no row moved (a change is
recorded on its row before libvirt is asked), skipping a change the restarted
server began itself.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import campaign
from tests.support.mcp_clients import call, mcp_session, run
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import REAL_URI, Server, real_vms_missing, wait_until
from tests.support.witnesses import events, our_domains, vm_rows

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

SECTION = "Crashes"
# A generous boot wait while the guest comes up; after a kill, a short grace, so that
# reconciliation settles a change the kill cut 11 s after it began.
ENV = {"RIFT_VM_BOOT_TIMEOUT_S": "60", "RIFT_SWEEP_INTERVAL_S": "1",
       "RIFT_ACTIVITY_STEP_S": "1"}
RECOVER_ENV = {"RIFT_VM_BOOT_TIMEOUT_S": "10", "RIFT_VM_CREATING_GRACE_S": "11"}
SETTLE_S = 60  # the grace, a sweep or two, and a save or restore on a busy machine
SLEEP_AFTER_S = 1
LIMIT_S = 120
TRIALS = campaign.scale(1, 3)  # each: a kill mid-sleep, then one mid-wake
LIVE = ("creating", "running", "sleeping", "paused")
SLEEP_EVENTS = ("vm_running", "vm_slept", "vm_woke")


def campaign_seed() -> int:
    """As tests/reliability/test_crashes.py's: printed, and `RIFT_CRASH_SEED` replays it."""
    seed = int(os.environ.get("RIFT_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash campaign seed: RIFT_CRASH_SEED={seed}")
    return seed


def _state(srv: Server, vm_id: str) -> tuple[str, str | None, Any]:
    row = vm_rows(srv)[vm_id]
    return row["status"], row["change"], row["change_at"]


def _broken(srv: Server, task_id: str, began: set[Any]) -> list[str] | None:
    """What breaks the promise, one line each (none when kept); None when a row moved
    while the domains were listed (the reading proves nothing: read again). A change
    whose `change_at` is not in `began` (those the kills cut) is the restarted
    server's own, under way: its VM is not judged."""
    rows = vm_rows(srv)
    domains = our_domains(srv, REAL_URI)
    if {k: tuple(r) for k, r in vm_rows(srv).items()} != {k: tuple(r) for k, r in rows.items()}:
        return None
    broken = [f"{d.name} has no live row" for vm_id, d in domains.items()
              if vm_id not in rows or rows[vm_id]["status"] not in LIVE]
    told = events(srv, task_id)
    for vm_id, row in rows.items():
        if row["task_id"] != task_id:
            continue
        status, domain = row["status"], domains.get(vm_id)
        if row["change"] is not None:
            if row["change_at"] in began:
                broken.append(f"{vm_id} is still {row['change']} after the restart")
            continue
        if status == "sleeping" and (domain is None or domain.active or not domain.saved):
            broken.append(f"{vm_id} sleeps but its domain is {domain}")
        if status == "running" and (domain is None or not domain.active):
            broken.append(f"{vm_id} runs but its domain is {domain}")
        last = [kind for kind, _, details in told
                if details.get("vm_id") == vm_id and kind in SLEEP_EVENTS][-1:]
        if status in ("running", "sleeping") and \
                (last == ["vm_slept"]) != (status == "sleeping"):
            broken.append(f"{vm_id} is {status} but its last event is {last}")
    return broken


def the_promise(srv: Server, task_id: str, began: set[Any]) -> list[str]:
    """`_broken` of the first reading in which no row moved."""
    deadline = time.monotonic() + 30
    while (broken := _broken(srv, task_id, began)) is None:
        assert time.monotonic() < deadline, "no reading within 30 s in which no row moved"
        time.sleep(0.05)
    return broken


class Home:
    """The rig (one data dir, its server of the moment) and the task's VM."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.task: dict[str, str] = {}
        self.cut_at: set[Any] = set()  # the `change_at` of every change a kill cut

    @property
    def srv(self) -> Server:
        return self.rig.server

    def until(self, status: str, change: str | None, what: str) -> None:
        wait_until(lambda: _state(self.srv, self.task["vm"])[:2] == (status, change),
                   LIMIT_S, what, every_s=0.002)

    def kill_and_restart(self, status: str, change: str) -> bool:
        """kill -9, a restart with the short grace, and a wait until the sweep has
        settled the change the kill cut; whether the kill found it under way."""
        self.rig.kill()
        at_kill = _state(self.srv, self.task["vm"])
        under_way = at_kill[:2] == (status, change)
        self.rig.restart(**RECOVER_ENV)
        if at_kill[1] is not None:
            self.cut_at.add(at_kill[2])
            wait_until(lambda: _state(self.srv, self.task["vm"]) != at_kill, SETTLE_S,
                       f"reconciliation settling the cut {at_kill[1]}")
        return under_way

    def exec_echo(self) -> dict[str, Any]:
        srv = self.srv

        async def one() -> dict[str, Any]:
            async with mcp_session(srv.url, srv.token, "sleepy") as s:
                return dict(await call(s, "rift_vm_exec", handle=self.task["handle"],
                                       vm_id=self.task["vm"], command="echo up"))

        return run(one, LIMIT_S)


def test_kill_9_mid_sleep_and_mid_wake_leaves_no_vm_both_asleep_and_awake(
        tmp_path: Path) -> None:
    rng = random.Random(campaign_seed())
    cut = {"sleep": 0, "wake": 0}
    with Rig.started(tmp_path, RealSettings(env=ENV)) as rig:
        home = Home(rig)

        async def opened() -> None:
            async with mcp_session(home.srv.url, home.srv.token, "sleepy") as s:
                made = await call(s, "rift_task_new", name="crash amid sleeps",
                                  sleep_after_s=SLEEP_AFTER_S)
                vm = (await call(s, "rift_vm_new", handle=made["handle"], image="tiny"))["vm"]
                assert vm["status"] == "running", vm
                home.task.update(id=made["task"]["id"], handle=made["handle"], vm=vm["id"])

        run(opened, LIMIT_S)
        for trial in range(TRIALS):
            # mid-sleep: the sweep has claimed the VM and is saving it
            home.until("running", "falling_asleep", "the sweep puts the VM to sleep")
            time.sleep(rng.uniform(0, 0.4))
            cut["sleep"] += home.kill_and_restart("running", "falling_asleep")
            assert the_promise(home.srv, home.task["id"], home.cut_at) == [], \
                f"mid-sleep, trial {trial}"
            home.until("sleeping", None, "it sleeps")
            # mid-wake: a call is restoring it (the kill cuts the call: the point)
            waker = threading.Thread(target=lambda: _swallow(home.exec_echo), daemon=True)
            waker.start()
            home.until("sleeping", "waking", "the exec wakes the VM")
            time.sleep(rng.uniform(0, 0.6))
            cut["wake"] += home.kill_and_restart("sleeping", "waking")
            waker.join(30)
            assert not waker.is_alive(), "the cut call hangs"
            assert the_promise(home.srv, home.task["id"], home.cut_at) == [], \
                f"mid-wake, trial {trial}"
            ran = home.exec_echo()  # wakes it if it sleeps
            assert (ran["status"], ran["stdout"]) == ("exited", "up\n"), ran
        campaign.record(SECTION, "real-guest kills mid-sleep / mid-wake that found the change "
                        f"under way (of {TRIALS} each)", f"{cut['sleep']} / {cut['wake']}")

        async def closed() -> None:
            async with mcp_session(home.srv.url, home.srv.token, "sleepy") as s:
                await call(s, "rift_task_close", handle=home.task["handle"])

        run(closed, LIMIT_S)
        assert our_domains(home.srv, REAL_URI) == {}


def _swallow(call_it: Any) -> None:
    with contextlib.suppress(BaseException):  # a call cut by the kill fails, as it should
        call_it()
