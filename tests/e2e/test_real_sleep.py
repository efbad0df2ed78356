"""Sleep and wake on a real `tiny` guest (SPEC §17), through the official MCP SDK
client: a running exec keeps its VM awake; once it ends and the task is quiet for
its `sleep_after_s`, the VM sleeps (its domain stopped with its saved state); the
next exec wakes it and answers, and an exec's output, a file written and the
guest's clock are as they should be after the wake, whose exec set the clock in
its own command (no session of the wake's own before it)."""

from __future__ import annotations

import time
from typing import Any

import libvirt
import pytest
from mcp.client.session import ClientSession

from tests.support.mcp_clients import call, mcp_session, run
from tests.support.real_guests import RealSettings
from tests.support.servers import REAL_URI, Server, log_lines, real_vms_missing

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 300
SLEEP_AFTER_S = 2
# The activity clock moves in steps of 1 s and the sweep runs every second, so the VM
# sleeps about SLEEP_AFTER_S + 2 s after the last call.
REAL = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": "120", "RIFT_SWEEP_INTERVAL_S": "1",
                         "RIFT_ACTIVITY_STEP_S": "1"})


async def _vm(s: ClientSession, vm_id: str) -> dict[str, Any]:
    return (await call(s, "rift_vm_get", vm_id=vm_id))["vm"]  # a view: no activity, no wake


async def _until_status(s: ClientSession, vm_id: str, status: str, limit_s: float) -> float:
    began = time.monotonic()
    while (await _vm(s, vm_id))["status"] != status:
        assert time.monotonic() - began < limit_s, f"not {status} after {limit_s} s"
        time.sleep(0.25)
    return time.monotonic() - began


def _domain_saved(vm_id: str) -> bool:
    conn = libvirt.open(REAL_URI)
    try:
        dom = conn.lookupByName(f"rift-{vm_id}")
        return not dom.isActive() and bool(dom.hasManagedSaveImage(0))
    finally:
        conn.close()


def test_a_quiet_tiny_vm_sleeps_and_its_next_exec_wakes_it_with_all_it_had(
        real: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            opened = await call(s, "rift_task_new", name="sleeps", sleep_after_s=SLEEP_AFTER_S)
            handle = opened["handle"]
            vm_id = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
            first = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id,
                               command="echo before-sleep; echo kept > /root/kept")
            assert (first["status"], first["stdout"]) == ("exited", "before-sleep\n"), first
            busy = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=0,
                              timeout_s=600, command="sleep 600")
            assert busy["status"] == "running", busy
            time.sleep(SLEEP_AFTER_S + 5)  # past its sleep time: the exec keeps it awake
            assert (await _vm(s, vm_id))["status"] == "running"
            await call(s, "rift_vm_exec_kill", handle=handle, exec_id=busy["exec_id"],
                       signal="KILL")
            await _until_status(s, vm_id, "sleeping", 60)
            asleep = await _vm(s, vm_id)
            assert asleep["ssh"] is None and _domain_saved(vm_id), asleep
            time.sleep(2)  # asleep a while: the clock must be set on wake
            began = time.monotonic()
            after = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id,
                               command="cat /root/kept; date +%s")
            wake_to_answer_s = time.monotonic() - began
            assert after["status"] == "exited", after
            kept, clock = after["stdout"].split()
            assert kept == "kept"
            assert abs(int(clock) - time.time()) <= 2, "the guest's clock is off after a wake"
            began = time.monotonic()
            await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command="true")
            warm_s = time.monotonic() - began
            woke = await _vm(s, vm_id)
            assert woke["status"] == "running" and woke["woke"]["ms"] > 0, woke
            # the wake logged in and left the clock (and the warm-up) to the exec
            resumed = [line for line in log_lines(real.log)
                       if line.get("msg") == "guest resumed" and line.get("vm_id") == vm_id]
            assert [line.get("warmed") for line in resumed] == ["by the exec"], resumed
            again = await call(s, "rift_vm_exec_get", handle=handle,
                               exec_id=first["exec_id"])  # its output, kept in the guest
            assert again["stdout"] == "before-sleep\n", again
            events = (await call(s, "rift_task_events", task_id=opened["task"]["id"],
                                 limit=100))["events"]
            kinds = [e["type"] for e in events]
            assert (kinds.count("vm_slept"), kinds.count("vm_woke")) == (1, 1), kinds
            print(f"wake: woke.ms {woke['woke']['ms']}, first exec after the wake "
                  f"{wake_to_answer_s:.2f} s, the next {warm_s:.2f} s")
            closed = await call(s, "rift_task_close", handle=handle)
            assert closed["destroyed"] == [vm_id]

    run(scenario, LIMIT_S)
