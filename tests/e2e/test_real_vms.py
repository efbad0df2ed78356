"""Real guests end to end: `rift serve` on qemu:///system booting the `tiny` image
under TCG, driven by the official MCP SDK client; `virsh` and the server's own
database are the witnesses. A VM's life (command, 10 MiB file, destroy), exec and
files at their limits (stdin, a command that never ends, output that never stops,
missing paths), a VM destroyed under an exec, a guest that powers itself off, a
guest that never answers SSH, and a domain made behind Rift's back. The
`kill -9` cases are in tests/reliability/test_crashes.py.

Needs qemu-system-x86_64 and a libvirtd answering on qemu:///system
(scripts/libvirt.sh; `make test` runs it first). Each server has its own data
dir, hence its own installation id: reconciliation leaves other servers' (and
other runs') domains alone, so these tests can share the host with anything.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from hypervisor.image_files import image_files
from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import Server, real_vms_missing, seed_images, wait_until
from tests.support.witnesses import (
    assert_rows_tell_the_truth,
    define_and_start,
    foreign_domain,
    install_id,
    new_vm_id,
    remove_domain,
    rows,
    virsh_names,
)

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 120  # any one scenario
BOOT_S = 60  # the boot wait of the servers whose guests must come up
QUICK_SWEEP_S = 3


def after_sweep(srv: Server) -> None:
    """Return as soon as the server's next sweep has ended (it writes a heartbeat)."""
    def beat() -> str:
        return str(rows(srv, "SELECT value FROM meta WHERE key = 'heartbeat_at'")[0][0])

    last = beat()
    wait_until(lambda: beat() != last, 3 * QUICK_SWEEP_S, "a sweep", every_s=0.01)


# -- servers ------------------------------------------------------------------------------

# A server whose guests boot (the boot wait is generous for a busy machine), sweeping
# every 2 s: reconciliation runs while VMs are made and used.
REAL = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": str(BOOT_S), "RIFT_SWEEP_INTERVAL_S": "2"})


def _broken_image(data_dir: Path) -> None:
    """An image `broken`: tiny's kernel and initramfs, but its command line runs a
    shell as PID 1 instead of the init that starts dropbear, so SSH never answers."""
    images = seed_images(data_dir)
    tiny = image_files(images, "tiny")
    broken = images / "broken"
    broken.mkdir()
    (broken / "vmlinux").symlink_to(tiny.kernel)
    (broken / "initrd.img").symlink_to(tiny.initrd)
    (broken / "manifest.json").write_text(json.dumps({
        "name": "broken", "kernel": {"file": "vmlinux"}, "initrd": {"file": "initrd.img"},
        "cmdline_base": f"{tiny.cmdline_base} rdinit=/bin/sh"}))


# A server that waits 5 s for a guest and sweeps every 3 s, with the image `broken`.
QUICK = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": "5", "RIFT_VM_CREATING_GRACE_S": "6",
                          "RIFT_SWEEP_INTERVAL_S": str(QUICK_SWEEP_S)},
                     prepare=_broken_image, check_left=False)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Rig.started(tmp_path_factory.mktemp("quick"), QUICK) as rig:
        yield rig.server


# -- the happy path -----------------------------------------------------------------------

def test_a_vm_runs_uname_takes_a_ten_mib_file_back_and_is_gone_after_destroy(
        real: Server) -> None:
    data = os.urandom(10 * 1024 * 1024)

    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="happy path"))["handle"]
            vm = (await call(s, "rift_vm_new", handle=handle, name="box",
                             image="tiny"))["vm"]
            assert vm["status"] == "running", vm
            assert vm["ssh"]["host"] == "127.0.0.1" and vm["ready_at"], vm
            assert f"rift-{vm['id']}" in virsh_names()
            ran = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                             command="uname -a")
            assert ran["exit_code"] == 0 and ran["stdout"].startswith("Linux rift "), ran
            assert not ran["timed_out"] and not ran["truncated"]

            wrote = await call(s, "rift_vm_write_file", handle=handle, vm_id=vm["id"],
                               path="/root/blob.bin", encoding="base64",
                               content=base64.b64encode(data).decode(), mode=0o600)
            assert wrote == {"path": "/root/blob.bin", "bytes": len(data)}
            summed = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                command="sha256sum /root/blob.bin")
            assert summed["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
            back = await call(s, "rift_vm_read_file", handle=handle, vm_id=vm["id"],
                              path="/root/blob.bin", encoding="base64")
            assert back["bytes"] == len(data) and not back["truncated"]
            assert hashlib.sha256(base64.b64decode(back["content"])).digest() == \
                hashlib.sha256(data).digest()

            gone = (await call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"]))["vm"]
            assert gone["status"] == "destroyed" and gone["destroyed_at"]
            assert f"rift-{vm['id']}" not in virsh_names()
            await refused(s, "vm_not_running", "rift_vm_exec", handle=handle, vm_id=vm["id"],
                          command="true")
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S)
    assert_rows_tell_the_truth(real)


# -- exec and files at their limits ---------------------------------------------------------

def test_exec_feeds_stdin_stops_at_its_timeout_caps_output_and_refuses_missing_paths(
        real: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(real.url, real.token) as s:
            handle = (await call(s, "rift_task_new", name="limits"))["handle"]
            vm_id = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]

            async def run_(command: str, **more: Any) -> tuple[dict[str, Any], float]:
                started = time.monotonic()
                out = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id,
                                 command=command, **more)
                return out, time.monotonic() - started

            fed, _ = await run_("cat; echo to-stderr >&2; exit 3", stdin="é\nline two\n")
            assert (fed["exit_code"], fed["stdout"], fed["stderr"]) == \
                (3, "é\nline two\n", "to-stderr\n")

            endless, took = await run_("echo begun; sleep 1000", timeout_s=2)
            assert endless["timed_out"] and endless["exit_code"] is None, endless
            assert endless["stdout"] == "begun\n"
            assert 2 <= took < 15, took
            left = (await run_("ps -o args"))[0]["stdout"]
            assert "sleep 1000" not in left  # killed, not orphaned

            flood, took = await run_("head -c 20000000 /dev/zero | tr '\\0' x")
            assert flood["truncated"] and flood["exit_code"] == 0 and not flood["timed_out"]
            assert flood["stdout"] == "x" * (1024 * 1024)  # the 1 MiB cap
            assert took < 60, took

            forever, took = await run_("yes gigabytes", timeout_s=3)
            assert forever["timed_out"] and forever["truncated"], forever
            assert len(forever["stdout"]) == 1024 * 1024 and took < 20, took

            for tool, extra in (("rift_vm_read_file", {}),
                                ("rift_vm_write_file", {"content": "x"})):
                missing = await refused(s, "invalid_argument", tool, handle=handle,
                                        vm_id=vm_id, path="/no/such/dir/file", **extra)
                assert missing["field"] == "path", missing
                assert missing["message"].startswith("path: "), missing
                assert "path" in missing["hint"], missing
            relative = await refused(s, "invalid_argument", "rift_vm_read_file",
                                     handle=handle, vm_id=vm_id, path="etc/passwd")
            assert relative["field"] == "path"
            still = (await run_("echo still here"))[0]
            assert still["stdout"] == "still here\n"
            closed = await call(s, "rift_task_close", handle=handle)
            assert closed["destroyed"] == [vm_id]

    run(scenario, LIMIT_S)
    assert_rows_tell_the_truth(real)


def test_a_vm_destroyed_under_a_waiting_exec_answers_it_lost_at_once(
        real: Server) -> None:
    """The call waiting on the exec answers as soon as the VM goes: the exec view,
    `lost` (the call did its work; the VM went under it)."""
    async def scenario() -> None:
        async with (mcp_session(real.url, real.token, "agent-a") as a,
                    mcp_session(real.url, real.token, "agent-b") as b):
            handle = (await call(a, "rift_task_new", name="pulled away"))["handle"]
            vm_id = (await call(a, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
            outcome: dict[str, Any] = {}

            async def long_exec() -> None:
                started = time.monotonic()
                outcome["view"] = await call(a, "rift_vm_exec", handle=handle, vm_id=vm_id,
                                             command="sleep 300", timeout_s=600)
                outcome["took"] = time.monotonic() - started

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_exec)
                await anyio.sleep(1.5)  # the exec is in the guest by now
                gone = await call(b, "rift_vm_destroy", vm_id=vm_id, takeover=True)
                assert gone["vm"]["status"] == "destroyed"
            assert outcome["took"] < 20, outcome
            view = outcome["view"]
            assert (view["vm_id"], view["status"], view["exit_code"]) == (vm_id, "lost", None)
            assert f"rift-{vm_id}" not in virsh_names()
            await refused(a, "vm_not_running", "rift_vm_exec", handle=handle, vm_id=vm_id,
                          command="true")
            await call(a, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S)
    assert_rows_tell_the_truth(real)


def test_a_guest_that_powers_itself_off_is_failed_by_the_next_sweep(real: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(real.url, real.token) as s:
            handle = (await call(s, "rift_task_new", name="poweroff"))["handle"]
            vm_id = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
            await s.call_tool("rift_vm_exec", {"handle": handle, "vm_id": vm_id,
                                               "command": "poweroff -f", "timeout_s": 10})
            with anyio.fail_after(20):
                while (vm := (await call(s, "rift_vm_get", vm_id=vm_id))["vm"])[
                        "status"] == "running":
                    await anyio.sleep(0.2)
            assert vm["status"] == "failed" and "shut off" in vm["error"], vm
            assert f"rift-{vm_id}" not in virsh_names()
            told = await call(s, "rift_task_events", task_id=vm["task_id"])
            assert [(e["type"], e["actor"]) for e in told["events"]][-1] == \
                ("vm_failed", "sweep")
            await refused(s, "vm_not_running", "rift_vm_exec", handle=handle, vm_id=vm_id,
                          command="true")
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S)
    assert_rows_tell_the_truth(real)


# -- a guest that never answers -----------------------------------------------------------

def test_a_guest_that_never_answers_ssh_is_failed_after_the_boot_wait_and_leaves_nothing(
        quick: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(quick.url, quick.token) as s:
            handle = (await call(s, "rift_task_new", name="mute guest"))["handle"]
            started = time.monotonic()
            vm = (await call(s, "rift_vm_new", handle=handle, image="broken"))["vm"]
            took = time.monotonic() - started
            assert vm["status"] == "failed", vm
            assert "did not answer SSH within 5s" in vm["error"], vm
            assert 5 <= took < 20, took
            assert f"rift-{vm['id']}" not in virsh_names()
            got = (await call(s, "rift_vm_get", vm_id=vm["id"]))["vm"]
            assert got["status"] == "failed"
            told = await call(s, "rift_task_events", task_id=vm["task_id"])
            kinds = [e["type"] for e in told["events"]]
            assert kinds == ["opened", "vm_creating", "vm_failed"], kinds
            await refused(s, "vm_not_running", "rift_vm_exec", handle=handle, vm_id=vm["id"],
                          command="true")
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S)
    assert_rows_tell_the_truth(quick)


# -- reconciliation -------------------------------------------------------------------------

def test_a_domain_made_behind_rifts_back_is_destroyed_by_the_next_sweep(
        quick: Server, tmp_path: Path) -> None:
    """One domain carries this installation's id and no row: the sweep destroys it.
    Another carries another installation's id: it is left alone."""
    images = quick.data_dir / "images"
    ours = foreign_domain(images, tmp_path, install_id(quick), new_vm_id())
    theirs = foreign_domain(images, tmp_path, "another-installation", new_vm_id())
    try:
        define_and_start(theirs, tmp_path)
        # Right after a sweep, so that the next one finds the domain made (a sweep
        # in the middle of `virsh create` would destroy it under virsh's hands).
        after_sweep(quick)
        define_and_start(ours, tmp_path, persistent=False)
        wait_until(lambda: ours.name not in virsh_names(), 3 * QUICK_SWEEP_S,
                   f"the sweep destroys {ours.name}")
        after_sweep(quick)
        assert theirs.name in virsh_names()
        assert_rows_tell_the_truth(quick)
    finally:
        remove_domain(ours.name)
        remove_domain(theirs.name)
