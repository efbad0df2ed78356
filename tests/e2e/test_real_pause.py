"""Pause and resume on real guests (SPEC §12), through the official MCP SDK client:
cycles of a `tiny` VM with a counter running (three in `make test`, twenty in
`make soak`: tests/support/soak.py) lose nothing (the counter
counts on, its exec's output continues at its offsets, a file written before
each pause reads back after it, the clock is right; a `debian` VM's pause is
in test_real_forks.py, on the VM it forks); and `kill -9` of `rift serve` in the
middle of a pause leaves a VM that is paused with its saved state or running,
never paused without one; in the middle of a snapshot, a VM running and a
snapshot whole or gone; in the middle of a fork, no domain without a live row,
no fork's copy of the state left behind, and the forks that came up working. A
snapshot onto a full disk fails saying so and leaves its VM running."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from typing import Any

import libvirt
import pytest
from mcp.client.session import ClientSession

from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import COUNTER, REAL_URI, Server, real_vms_missing, wait_until
from tests.support.soak import long_form, scale
from tests.support.witnesses import our_domains, pool_vm_ids, rows

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 300
CYCLES = scale(3, 20)
REAL = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": "120", "RIFT_SWEEP_INTERVAL_S": "2"})


async def _sh(s: ClientSession, handle: str, vm_id: str, command: str) -> str:
    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command=command)
    assert (done["status"], done["exit_code"]) == ("exited", 0), done
    return str(done["stdout"])


async def _count(s: ClientSession, handle: str, vm_id: str) -> int:
    return int(await _sh(s, handle, vm_id, "cat /tmp/count"))


async def _cycles(s: ClientSession, handle: str, vm_id: str, cycles: int) -> None:
    """Pause and resume `cycles` times with the counter running; every check of SPEC §12."""
    counter = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=1,
                         timeout_s=3600, command=COUNTER)
    assert counter["status"] == "running", counter
    offset = 0
    seen = ""
    for n in range(cycles):
        written = await call(s, "rift_vm_write_file", handle=handle, vm_id=vm_id,
                             path=f"/root/before-{n}", content=f"cycle {n}\n")
        assert written["bytes"] == len(f"cycle {n}\n")
        before = await _count(s, handle, vm_id)
        paused = (await call(s, "rift_vm_pause", handle=handle, vm_id=vm_id))["vm"]
        assert paused["status"] == "paused" and paused["ssh"] is None, paused
        if n == 0:  # what a paused VM answers, once
            again = (await call(s, "rift_vm_pause", handle=handle, vm_id=vm_id))["vm"]
            assert again["status"] == "paused"
            error = await refused(s, "vm_not_running", "rift_vm_exec", handle=handle,
                                  vm_id=vm_id, command="true")
            assert "rift_vm_resume" in error["hint"]
            await refused(s, "vm_not_running", "rift_vm_exec_get", handle=handle,
                          exec_id=counter["exec_id"])
            await refused(s, "vm_not_running", "rift_vm_read_file", handle=handle,
                          vm_id=vm_id, path=f"/root/before-{n}")
            time.sleep(2)  # parked for a while: the clock must be set on resume
        resumed = (await call(s, "rift_vm_resume", handle=handle, vm_id=vm_id))["vm"]
        assert resumed["status"] == "running" and resumed["ssh"] is not None, resumed
        read = await call(s, "rift_vm_read_file", handle=handle, vm_id=vm_id,
                          path=f"/root/before-{n}")
        assert read["content"] == f"cycle {n}\n", (n, read)
        if n == 0:
            skew = int(await _sh(s, handle, vm_id, "date +%s")) - time.time()
            assert abs(skew) <= 2, f"the guest's clock is {skew:.1f} s off after a resume"
        # The counter's exec goes on at its offsets, and the counter counts on.
        more = await call(s, "rift_vm_exec_get", handle=handle, exec_id=counter["exec_id"],
                          stdout_offset=offset, wait_s=5)
        assert more["status"] == "running", more
        seen += more["stdout"]
        offset = more["stdout_offset"]
        assert offset == len(seen.encode())
        after = await _count(s, handle, vm_id)
        for _ in range(50):
            if after > before:
                break
            time.sleep(0.2)
            after = await _count(s, handle, vm_id)
        assert after > before, (n, before, after)
    numbers = [int(line) for line in seen.split()]
    assert numbers == list(range(1, len(numbers) + 1)), "the counter's output has a gap"
    assert await call(s, "rift_vm_exec_kill", handle=handle, exec_id=counter["exec_id"],
                      signal="KILL")


@pytest.mark.soak
def test_pauses_of_a_tiny_vm_lose_no_process_file_or_output(real: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="pauses"))["handle"]
            vm_id = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
            await _cycles(s, handle, vm_id, CYCLES)
            task = (await call(s, "rift_task_get", handle=handle))["task"]
            kinds = await _event_types(s, task["id"])
            assert kinds.count("vm_paused") == kinds.count("vm_resumed") == CYCLES
            await call(s, "rift_vm_pause", handle=handle, vm_id=vm_id)
            closed = await call(s, "rift_task_close", handle=handle)  # a paused VM goes too
            assert closed["destroyed"] == [vm_id]

    run(scenario, LIMIT_S * 2)


def test_kill_9_in_the_middle_of_a_pause_leaves_a_vm_paused_with_its_state_or_running(
        real: Server, rig: Rig) -> None:
    handle, vm_id = _vm_with_a_file(real, "cut pause")

    again = _cut_mid_change(rig, "rift_vm_pause", handle, vm_id, "pausing")
    wait_until(lambda: _change(again, vm_id) is None, 60,
               "reconciliation settling the cut pause")
    status = rows(again, "select status from vms where id = ?", vm_id)[0]["status"]
    dom = libvirt.open(REAL_URI).lookupByName(f"rift-{vm_id}")
    if status == "paused":
        assert not dom.isActive() and dom.hasManagedSaveImage(0), "paused without its state"
    else:
        assert status == "running" and dom.isActive(), status

    async def after() -> None:
        async with mcp_session(again.url, again.token) as s:
            assert (await call(s, "rift_vm_resume", handle=handle, vm_id=vm_id))["vm"][
                "status"] == "running"
            read = await call(s, "rift_vm_read_file", handle=handle, vm_id=vm_id,
                              path="/root/kept")
            assert read["content"] == "kept\n"
            task = (await call(s, "rift_task_get", handle=handle))["task"]
            kinds = await _event_types(s, task["id"])
            assert kinds.count("vm_paused") == (1 if status == "paused" else 0), kinds
            await call(s, "rift_task_close", handle=handle)

    run(after, LIMIT_S)


async def _event_types(s: ClientSession, task_id: str) -> list[str]:
    kinds: list[str] = []
    after = 0
    while True:
        page = (await call(s, "rift_task_events", task_id=task_id, after_id=after,
                           limit=100))["events"]
        if not page:
            return kinds
        kinds += [e["type"] for e in page]
        after = page[-1]["id"]


def _change(srv: Server, vm_id: str) -> str | None:
    found = rows(srv, "select change from vms where id = ?", vm_id)
    return found[0]["change"] if found else None


def _quietly(call_it: Any) -> None:
    with contextlib.suppress(Exception):  # the server it talks to is killed under it
        call_it()


def _kill_and_restart(rig: Rig, cut: threading.Thread) -> Server:
    """`kill -9` of the server with `cut`'s call in flight, and a restart with a
    short grace, so that reconciliation judges what was cut soon after."""
    rig.kill()
    cut.join(30)
    return rig.restart(RIFT_VM_BOOT_TIMEOUT_S="10", RIFT_VM_CREATING_GRACE_S="11")


def _cut_mid_change(rig: Rig, tool: str, handle: str, vm_id: str, change: str) -> Server:
    """Call `tool` on the VM, `kill -9` the server once the VM's change is `change`
    and libvirt is at work (saving), and answer the restarted server."""
    srv = rig.server

    async def cut_call() -> None:
        async with mcp_session(srv.url, srv.token) as s:
            await call(s, tool, handle=handle, vm_id=vm_id)

    cut = _in_flight(lambda: run(cut_call, 60))
    wait_until(lambda: _change(srv, vm_id) == change, 30, f"{tool} under way", every_s=0.01)
    time.sleep(0.25)  # libvirt is saving now
    return _kill_and_restart(rig, cut)


def _in_flight(call_it: Any) -> threading.Thread:
    thread = threading.Thread(target=lambda: _quietly(call_it), daemon=True)
    thread.start()
    return thread


def _vm_with_a_file(srv: Server, name: str) -> tuple[str, str]:
    """A new task's handle and its `tiny` VM, with /root/kept written."""
    async def made() -> tuple[str, str]:
        async with mcp_session(srv.url, srv.token) as s:
            handle = (await call(s, "rift_task_new", name=name))["handle"]
            vm_id = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
            await call(s, "rift_vm_write_file", handle=handle, vm_id=vm_id, path="/root/kept",
                       content="kept\n")
            return handle, vm_id

    return run(made, LIMIT_S)


def _snapshot_dirs(srv: Server) -> set[str]:
    folder = srv.data_dir / "snapshots"
    return {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()


@long_form("the cut pause above; tests/unit/test_snapshots.py (a snapshot a crash cut is "
           "abandoned, folders and fork copies a crash left swept); tests/reliability/"
           "test_crashes.py's kills on real guests")
def test_kill_9_in_the_middle_of_a_snapshot_leaves_the_vm_running_and_it_whole_or_gone(
        real: Server, rig: Rig) -> None:
    handle, vm_id = _vm_with_a_file(real, "cut snapshot")

    again = _cut_mid_change(rig, "rift_vm_snapshot", handle, vm_id, "snapshotting")
    wait_until(lambda: _change(again, vm_id) is None and not rows(
        again, "select id from snapshots where state != 'ready'"), 60,
        "the sweep settling the cut snapshot")
    assert rows(again, "select status from vms where id = ?", vm_id)[0]["status"] == "running"
    assert libvirt.open(REAL_URI).lookupByName(f"rift-{vm_id}").isActive()
    ready = {r["id"] for r in rows(again, "select id from snapshots")}
    wait_until(lambda: _snapshot_dirs(again) == ready, 30,
               "the snapshot folders are those of the ready snapshots")

    async def after() -> None:
        async with mcp_session(again.url, again.token) as s:
            read = await call(s, "rift_vm_read_file", handle=handle, vm_id=vm_id,
                              path="/root/kept")
            assert read["content"] == "kept\n"
            for snapshot_id in ready:  # a snapshot the cut left whole forks
                fork = (await call(s, "rift_vm_fork", handle=handle,
                                   snapshot_id=snapshot_id))["vms"][0]
                assert fork["status"] == "running", fork
                assert (await call(s, "rift_vm_read_file", handle=handle, vm_id=fork["id"],
                                   path="/root/kept"))["content"] == "kept\n"
            await call(s, "rift_task_close", handle=handle)

    run(after, LIMIT_S)
    wait_until(lambda: not _snapshot_dirs(again), 30, "no snapshot files after the close")


@long_form("the cut pause above; tests/unit/test_snapshots.py (fork copies a crash left "
           "swept); tests/reliability/test_crashes.py's kills on real guests")
def test_kill_9_in_the_middle_of_a_fork_leaves_no_domain_without_a_row_nor_a_copy(
        real: Server, rig: Rig) -> None:
    async def before() -> tuple[str, str, str]:
        async with mcp_session(real.url, real.token) as s:
            opened = await call(s, "rift_task_new", name="cut fork")
            handle = opened["handle"]
            vm_id = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
            await call(s, "rift_vm_write_file", handle=handle, vm_id=vm_id, path="/root/kept",
                       content="kept\n")
            snap = (await call(s, "rift_vm_snapshot", handle=handle, vm_id=vm_id))["snapshot"]
            return handle, opened["task"]["id"], snap["id"]

    handle, task_id, snapshot_id = run(before, LIMIT_S)

    async def fork() -> None:
        async with mcp_session(real.url, real.token) as s:
            await call(s, "rift_vm_fork", handle=handle, snapshot_id=snapshot_id, count=2)

    def forks(srv: Server) -> list[Any]:
        return rows(srv, "select id, status from vms where task_id = ? and id in (select "
                    "json_extract(details, '$.vm_id') from events where type = 'vm_creating' "
                    "and json_extract(details, '$.start') = 'fork')", task_id)

    cut = _in_flight(lambda: run(fork, 60))
    wait_until(lambda: len(forks(real)) == 2, 30, "the forks recorded", every_s=0.01)
    time.sleep(0.5)  # their states are being copied and restored now
    again = _kill_and_restart(rig, cut)
    wait_until(lambda: all(f["status"] != "creating" for f in forks(again)), 60,
               "reconciliation settling the cut forks")
    live = {r["id"] for r in rows(again, "select id from vms where status in "
                                  "('running', 'paused')")}
    assert set(our_domains(again)) <= live | pool_vm_ids(again), "a domain without a row"
    folder = again.data_dir / "snapshots" / snapshot_id
    wait_until(lambda: not list(folder.glob(".fork-*")), 60,
               "the sweep removing the forks' copies of the state")
    running = [f["id"] for f in forks(again) if f["status"] == "running"]

    async def after() -> None:
        async with mcp_session(again.url, again.token) as s:
            for fork_id in running:  # a fork that came up before the kill works
                assert (await call(s, "rift_vm_read_file", handle=handle, vm_id=fork_id,
                                   path="/root/kept"))["content"] == "kept\n"
            await call(s, "rift_task_close", handle=handle)

    run(after, LIMIT_S)


def test_a_snapshot_onto_a_full_disk_fails_clearly_and_leaves_the_vm_running(
        real: Server) -> None:
    full = real.data_dir / "snapshots"
    full.mkdir(exist_ok=True)
    assert not _snapshot_dirs(real), "the test needs no snapshot on its host"
    # 16 MiB: less than a 256 MiB guest's saved memory.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(full)], check=True)
    try:
        async def scenario() -> None:
            async with mcp_session(real.url, real.token) as s:
                handle = (await call(s, "rift_task_new", name="full disk"))["handle"]
                vm_id = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
                error = await refused(s, "hypervisor_error", "rift_vm_snapshot", handle=handle,
                                      vm_id=vm_id)
                assert "No space left on device" in error["message"], error
                vm = (await call(s, "rift_vm_get", vm_id=vm_id))["vm"]
                assert vm["status"] == "running", vm
                assert (await _sh(s, handle, vm_id, "echo still here")).strip() == "still here"
                task = (await call(s, "rift_task_get", handle=handle))["task"]
                assert task["snapshots"] == []
                assert not list(full.iterdir()), "a cut snapshot's files stayed"
                await call(s, "rift_task_close", handle=handle)

        run(scenario, LIMIT_S)
    finally:
        subprocess.run(["umount", str(full)], check=True)
