"""`kill -9` of `rift serve` in the middle of `rift_vm_new` and of
`rift_task_close`, for real (SIGKILL, no shutdown), then a restart on the same
data dir: no domain leaked, no row lying, every state change with its event.
Needs what test_real_vms.py needs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.conftest import (
    LIVE,
    Server,
    assert_rows_tell_the_truth,
    define_and_start,
    events,
    foreign_domain,
    install_id,
    kill_server,
    new_vm_id,
    our_domains,
    real_vms_missing,
    remove_domain,
    restart_server,
    rows,
    start_real_server,
    stop_server,
    virsh_names,
    vm_rows,
    wait_until,
)
from tests.e2e.test_mcp import call, mcp_session, run
from tests.e2e.test_real_vms import BOOT_S, LIMIT_S

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]


def in_thread(scenario: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    """Run an async scenario in its own thread and event loop (a call that a
    `kill -9` will cut); answers the thread and where its exception lands."""
    failures: list[BaseException] = []

    def body() -> None:
        try:
            anyio.run(scenario)
        except BaseException as exc:  # what a cut call raises is the point
            failures.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, failures


def test_kill_9_in_the_middle_of_vm_new_leaves_no_domain_after_restart(tmp_path: Path) -> None:
    """The crash comes while the new guest boots (its row `creating`, its domain up).
    The restart's reconciliation at once destroys a domain with no row (made behind
    Rift's back while it was down); the booting VM's row turns `failed` once older
    than the grace, its domain destroyed."""
    proc, srv = start_real_server(tmp_path, RIFT_VM_BOOT_TIMEOUT_S=str(BOOT_S))
    restarted: tuple[Any, Server] | None = None
    stray = foreign_domain(srv.data_dir / "images", tmp_path, install_id(srv), new_vm_id())
    try:
        task: dict[str, str] = {}

        async def create() -> None:
            async with mcp_session(srv.url, srv.token, "doomed") as s:
                opened = await call(s, "rift_task_new", name="crash in vm_new")
                task.update(id=opened["task"]["id"], handle=opened["handle"])
                await s.call_tool("rift_vm_new", {"handle": opened["handle"]})

        thread, failures = in_thread(create)
        vm_id = wait_until(lambda: next(iter(vm_rows(srv, task.get("id", "-"))), None),
                           30, "the VM row exists", every_s=0.02)
        wait_until(lambda: vm_id in our_domains(srv), 30, "its domain exists", every_s=0.02)
        assert vm_rows(srv)[vm_id]["status"] == "creating"
        kill_server(proc)
        thread.join(30)
        assert not thread.is_alive(), "the call in flight hangs after the crash"
        assert failures, "rift_vm_new answered although its server was killed"
        assert vm_id in our_domains(srv)  # the guest outlived its control plane
        define_and_start(stray, tmp_path)

        proc, srv2 = restart_server(srv, RIFT_VM_BOOT_TIMEOUT_S="5",
                                    RIFT_VM_CREATING_GRACE_S="6", RIFT_SWEEP_INTERVAL_S="1")
        restarted = (proc, srv2)
        assert stray.name not in virsh_names()  # gone before the first call was taken
        assert_rows_tell_the_truth(srv2)
        wait_until(lambda: vm_rows(srv2)[vm_id]["status"] == "failed", 30,
                   "the interrupted create turns failed")
        assert f"rift-{vm_id}" not in virsh_names()
        vm = vm_rows(srv2)[vm_id]
        assert "interrupted" in vm["error"], vm["error"]
        told = events(srv2, task["id"])
        assert [(k, actor) for k, actor, _ in told] == [
            ("opened", "mcp:doomed"), ("vm_creating", "mcp:doomed"), ("vm_failed", "sweep")]
        assert_rows_tell_the_truth(srv2)

        async def still_usable() -> None:
            async with mcp_session(srv2.url, srv2.token, "doomed") as s:
                got = await call(s, "rift_task_get", handle=task["handle"])
                assert got["task"]["status"] == "open"
                assert [v["status"] for v in got["task"]["vms"]] == ["failed"]
                await call(s, "rift_task_close", handle=task["handle"])

        run(still_usable, LIMIT_S)
    finally:
        stop_server(restarted[0] if restarted else proc)
        remove_domain(stray.name)
        for vm_id in our_domains(srv):
            remove_domain(f"rift-{vm_id}")


def test_kill_9_in_the_middle_of_task_close_is_finished_after_restart(tmp_path: Path) -> None:
    """The crash comes once the close is committed and while its VMs are being
    destroyed (one may be left shut off but defined: libvirt finished the destroy
    its dead client asked for); the restarted server destroys the rest before it
    takes a call."""
    proc, srv = start_real_server(tmp_path, RIFT_VM_BOOT_TIMEOUT_S=str(BOOT_S))
    restarted: tuple[Any, Server] | None = None
    try:
        task: dict[str, Any] = {}

        async def prepare() -> None:
            async with mcp_session(srv.url, srv.token, "closer") as s:
                opened = await call(s, "rift_task_new", name="crash in close")
                handle = opened["handle"]
                task.update(id=opened["task"]["id"], handle=handle)
                made: list[dict[str, Any]] = []

                async def one(name: str) -> None:
                    made.append((await call(s, "rift_vm_new", handle=handle, name=name))["vm"])

                async with anyio.create_task_group() as tg:  # both boot at once
                    tg.start_soon(one, "first")
                    tg.start_soon(one, "second")
                for vm in made:
                    assert vm["status"] == "running", vm
                    ran = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                     command="true")
                    assert ran["exit_code"] == 0
                task["vms"] = sorted(vm["id"] for vm in made)

        run(prepare, LIMIT_S)

        async def close() -> None:
            async with mcp_session(srv.url, srv.token, "closer") as s:
                await s.call_tool("rift_task_close", {"handle": task["handle"]})

        thread, failures = in_thread(close)
        wait_until(lambda: rows(srv, "SELECT status FROM tasks WHERE id = ?",
                                task["id"])[0]["status"] == "closed",
                   30, "the close is committed", every_s=0.002)
        kill_server(proc)
        at_kill = vm_rows(srv, task["id"])
        thread.join(30)
        assert not thread.is_alive(), "the call in flight hangs after the crash"
        assert failures, "rift_task_close answered although its server was killed"
        live = [vm_id for vm_id, vm in at_kill.items() if vm["status"] in LIVE]
        assert live, "the kill came after the close had finished: nothing was cut"
        assert set(our_domains(srv)) >= set(live)

        proc, srv2 = restart_server(srv)
        restarted = (proc, srv2)
        # The start-up pass (before the first call) finished the close: nothing waits
        # for the first scheduled sweep.
        assert not our_domains(srv2)
        assert not {f"rift-{vm_id}" for vm_id in task["vms"]} & virsh_names()
        final = vm_rows(srv2, task["id"])
        assert {vm_id: vm["status"] for vm_id, vm in final.items()} == \
            dict.fromkeys(task["vms"], "destroyed")
        told = events(srv2, task["id"])
        assert [k for k, _, _ in told].count("closed") == 1
        destroyed_by = {d["vm_id"]: actor for k, actor, d in told if k == "vm_destroyed"}
        assert set(destroyed_by) == set(task["vms"])
        assert {destroyed_by[vm_id] for vm_id in live} == {"sweep"}
        assert_rows_tell_the_truth(srv2)
    finally:
        stop_server(restarted[0] if restarted else proc)
        for vm_id in our_domains(srv):
            remove_domain(f"rift-{vm_id}")
