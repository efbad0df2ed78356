"""Execs on real guests (SPEC §10), through the official MCP SDK client: a command
that outlives its call and is read on by long polls, stdin fed and closed, a
kill that leaves no process of its group, fifty at once (ten on `debian`), an exec that lives
through `kill -9` of `rift serve` and is read to its end by the next one, and an
exec whose VM is destroyed ending `lost`; on `tiny`, and in `make soak` on
`debian` too (bash, the login shell there; tests/support/soak.py): its boot and
tour are about half of the module's time under TCG, and `make test` runs execs
in debian's bash in test_real_debian.py and test_real_egress.py. The events and
the task view's `running_execs` say the same."""

from __future__ import annotations

import time
from typing import Any

import pytest
from mcp.client.session import ClientSession

from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import Server, real_vms_missing
from tests.support.soak import SOAK, scale

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 300
# (image, execs at once): twenty on `tiny` (fifty in make soak); ten on `debian`, where
# each costs more under TCG, in make soak only
TOURS: tuple[tuple[str, int], ...] = (("tiny", scale(20, 50)), *scale((), (("debian", 10),)))


REAL = RealSettings(debian=SOAK, env={"RIFT_VM_BOOT_TIMEOUT_S": "120",
                                      "RIFT_SWEEP_INTERVAL_S": "2"})


async def _until_ended(s: ClientSession, handle: str, exec_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        view = await call(s, "rift_vm_exec_get", handle=handle, exec_id=exec_id, wait_s=5)
        if view["status"] != "running":
            return view
        assert time.monotonic() < deadline, view


async def _tour(s: ClientSession, handle: str, vm_id: str, at_once: int) -> None:
    started = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=0,
                         command="for i in 1 2 3; do echo $i; sleep 1; done; echo done >&2")
    assert started["status"] == "running" and started["exit_code"] is None, started
    first = await call(s, "rift_vm_exec_get", handle=handle, exec_id=started["exec_id"],
                       wait_s=10)
    assert first["stdout"].startswith("1\n"), first
    ended = await _until_ended(s, handle, started["exec_id"])
    assert (ended["status"], ended["exit_code"], ended["stdout"], ended["stderr"]) == \
        ("exited", 0, "1\n2\n3\n", "done\n"), ended
    rest = await call(s, "rift_vm_exec_get", handle=handle, exec_id=started["exec_id"],
                      stdout_offset=first["stdout_offset"])
    assert first["stdout"] + rest["stdout"] == "1\n2\n3\n"

    fed = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=0,
                     command="read a; read b; echo $a-$b")
    await call(s, "rift_vm_exec_input", handle=handle, exec_id=fed["exec_id"], data="x\n")
    await call(s, "rift_vm_exec_input", handle=handle, exec_id=fed["exec_id"], data="y\n",
               eof=True)
    assert (await _until_ended(s, handle, fed["exec_id"]))["stdout"] == "x-y\n"
    await refused(s, "invalid_argument", "rift_vm_exec_input", handle=handle,
                  exec_id=fed["exec_id"], data="late")

    stubborn = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=1,
                          command="sh -c 'trap \"\" TERM; sleep 600' & sleep 600")
    assert stubborn["status"] == "running"
    await call(s, "rift_vm_exec_kill", handle=handle, exec_id=stubborn["exec_id"])
    killed = await _until_ended(s, handle, stubborn["exec_id"])
    assert killed["status"] == "killed" and killed["signal"] == "TERM", killed
    left = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command="ps -o args")
    assert "sleep 600" not in left["stdout"], left  # the TERM-ignoring child too

    many = [await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=0,
                       command=f"sleep 1; echo {i}") for i in range(at_once)]
    for i, one in enumerate(many):
        assert (await _until_ended(s, handle, one["exec_id"]))["stdout"] == f"{i}\n"


@pytest.mark.soak  # its long form tours `debian` too (TOURS)
def test_execs_outlive_their_calls_take_input_and_are_killed_whole(real: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="execs"))["handle"]
            for image, at_once in TOURS:
                vm_id = (await call(s, "rift_vm_new", handle=handle, image=image))["vm"]["id"]
                await _tour(s, handle, vm_id, at_once)
            listed = await call(s, "rift_vm_exec_list", handle=handle, status="all")
            assert len(listed["execs"]) == sum(4 + at_once for _, at_once in TOURS)
            assert not (await call(s, "rift_vm_exec_list", handle=handle))["execs"]
            task = (await call(s, "rift_task_get", handle=handle))["task"]
            events = await call(s, "rift_task_events", task_id=task["id"], limit=100,
                                after_id=0)
            assert "exec_started" in [e["type"] for e in events["events"]]
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S * 2)


def test_an_exec_lives_through_kill_9_of_rift_and_its_vm_going_ends_it_lost(
        real: Server, rig: Rig) -> None:
    async def before() -> tuple[str, str, str]:
        async with mcp_session(real.url, real.token) as s:
            opened = await call(s, "rift_task_new", name="restart")
            vm_id = (await call(s, "rift_vm_new", handle=opened["handle"],
                                image="tiny"))["vm"]["id"]
            ex = await call(s, "rift_vm_exec", handle=opened["handle"], vm_id=vm_id,
                            wait_s=0, command="sleep 4; echo survived")
            task = (await call(s, "rift_task_get", handle=opened["handle"]))["task"]
            assert task["running_execs"] == 1
            return opened["handle"], vm_id, ex["exec_id"]

    handle, vm_id, exec_id = run(before, LIMIT_S)
    rig.kill()
    again = rig.restart()

    async def after() -> None:
        async with mcp_session(again.url, again.token) as s:
            ended = await _until_ended(s, handle, exec_id)
            assert (ended["status"], ended["exit_code"], ended["stdout"]) == \
                ("exited", 0, "survived\n"), ended
            doomed = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=0,
                                command="sleep 600")
            await call(s, "rift_vm_destroy", handle=handle, vm_id=vm_id)
            lost = await call(s, "rift_vm_exec_get", handle=handle, exec_id=doomed["exec_id"])
            assert lost["status"] == "lost" and lost["ended_at"], lost
            task = (await call(s, "rift_task_get", handle=handle))["task"]
            assert task["running_execs"] == 0
            await call(s, "rift_task_close", handle=handle)

    run(after, LIMIT_S)
