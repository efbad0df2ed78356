"""Sleep and wake on a real `tiny` guest (SPEC §17), through the official MCP SDK
client: a running exec keeps its VM awake; once it ends and the task is quiet for
its `sleep_after_s`, the VM sleeps (its domain stopped with its saved state); the
next exec wakes it and answers, and an exec's output, a file written and the
guest's clock are as they should be after the wake, whose exec set the clock in
its own command (no session of the wake's own before it); then a request to an
exposure of the sleeping VM wakes it, and the guest's clock is set a moment after."""

from __future__ import annotations

import time
from typing import Any

import httpx
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


# the guest's clock, written where its httpd serves it, by a loop no exec waits for
_CLOCK_LOOP = ("mkdir -p /tmp/www && busybox httpd -p 127.0.0.1:8001 -h /tmp/www && "
               "setsid sh -c 'while :; do date +%s > /tmp/www/t; mv /tmp/www/t /tmp/www/now; "
               "usleep 100000; done' </dev/null >/dev/null 2>&1 & "
               "while [ ! -e /tmp/www/now ]; do usleep 50000; done")


async def _guest_clock(http: httpx.AsyncClient, url: str) -> float:
    """The guest's clock as its loop last wrote it; 0 when the request failed (the VM
    quiet that long fell asleep under it)."""
    try:
        return float((await http.get(url)).text)
    except (httpx.HTTPError, ValueError):
        return 0.0


async def _woken_by_an_exposure(real: Server, s: ClientSession, handle: str,
                                vm_id: str) -> None:
    """A GET through an exposure wakes the sleeping VM and is answered; the guest's
    clock is then set with no exec (with the warm-up a moment after the request), as
    read through the exposure."""
    await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command=_CLOCK_LOOP)
    exposed = await call(s, "rift_vm_expose", handle=handle, vm_id=vm_id, port=8001)
    url = real.url + "/x/" + exposed["exposure"]["url"].split("/x/")[1] + "now"
    async with httpx.AsyncClient(timeout=60) as http:
        assert abs(int((await http.get(url)).text) - time.time()) <= 2
        await _until_status(s, vm_id, "sleeping", 60)
        time.sleep(3)  # asleep a while: its clock falls behind
        answer = await http.get(url)  # wakes it
        assert answer.status_code == 200, answer.text
        began = time.monotonic()
        while abs(await _guest_clock(http, url) - time.time()) > 2:
            assert time.monotonic() - began < 10, "the guest's clock is off after the wake"
            time.sleep(0.2)
    resumed = [line.get("warmed") for line in log_lines(real.log)
               if line.get("msg") == "guest resumed" and line.get("vm_id") == vm_id]
    assert resumed == ["by the exec", "later"], resumed  # no session before the request


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
            await _woken_by_an_exposure(real, s, handle, vm_id)
            closed = await call(s, "rift_task_close", handle=handle)
            assert closed["destroyed"] == [vm_id]

    run(scenario, LIMIT_S)
