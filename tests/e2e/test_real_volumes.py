"""Volumes on real guests (SPEC §18), through the official MCP SDK client: a file
and a folder with their modes written in a volume in one task's `tiny` VM (paused
and resumed with it attached), the task closed (its VM destroyed, the volume
detached, never deleted), a VM of another task started with the volume read-only
(`volumes` on `rift_vm_new`) and the files read back there (and again after a
clone of the volume and a pause and resume of the reader), the busy and
bad-input refusals, and the hot-plug and mount within a second or so; a snapshot
of the writer keeps the volume as it was (the VM running on with it writable), and
a clone of that copy, made before the snapshot goes with its task, holds it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from mcp.client.session import ClientSession

from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.real_guests import RealSettings
from tests.support.servers import Server, real_vms_missing
from tests.support.soak import long_form

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 300
REAL = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": "120"})


async def _sh(s: ClientSession, handle: str, vm_id: str, command: str) -> str:
    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command=command)
    assert (done["status"], done["exit_code"]) == ("exited", 0), done
    return str(done["stdout"])


async def _vm(s: ClientSession, name: str) -> tuple[str, str, str]:
    opened = await call(s, "rift_task_new", name=name)
    vm = (await call(s, "rift_vm_new", handle=opened["handle"], image="tiny"))["vm"]
    assert vm["status"] == "running", vm
    return opened["task"]["id"], opened["handle"], vm["id"]


async def _attach(s: ClientSession, handle: str, vm_id: str, **args: Any) -> tuple[
        dict[str, Any], float]:
    began = time.monotonic()
    vm = (await call(s, "rift_vm_attach_volume", handle=handle, vm_id=vm_id, **args))["vm"]
    return vm, time.monotonic() - began


def test_a_volume_keeps_files_and_modes_from_one_task_to_the_next(real: Server) -> None:
    took: list[float] = []

    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            vol = (await call(s, "rift_volume_new", name="work", size_gib=2))["volume"]
            task_a, handle_a, vm_a = await _vm(s, "writer")
            reader = await call(s, "rift_task_new", name="reader")
            task_b, handle_b = reader["task"]["id"], reader["handle"]

            vm, seconds = await _attach(s, handle_a, vm_a, volume_id=vol["id"], path="/work")
            took.append(seconds)
            assert vm["volumes"] == [{"volume_id": vol["id"], "path": "/work",
                                      "read_only": False}], vm
            mounted = await _sh(s, handle_a, vm_a, "grep ' /work ' /proc/mounts")
            assert mounted.split()[2] == "ext4" and mounted.split()[3].startswith("rw"), mounted
            await call(s, "rift_vm_write_file", handle=handle_a, vm_id=vm_a,
                       path="/work/notes.txt", content="kept across tasks\n", mode=0o640)
            await call(s, "rift_vm_pause", handle=handle_a, vm_id=vm_a)  # keeps it attached
            resumed = (await call(s, "rift_vm_resume", handle=handle_a, vm_id=vm_a))["vm"]
            assert [m["volume_id"] for m in resumed["volumes"]] == [vol["id"]], resumed
            await _sh(s, handle_a, vm_a, "mkdir /work/secret && chmod 0700 /work/secret && "
                      "echo x > /work/secret/key && chmod 0600 /work/secret/key")
            # a snapshot keeps the volume as it is; the VM runs on with it writable
            snap = (await call(s, "rift_vm_snapshot", handle=handle_a, vm_id=vm_a))["snapshot"]
            await _sh(s, handle_a, vm_a, "echo later > /work/after.txt && sync")
            then = (await call(s, "rift_volume_clone", volume_id=vol["id"], name="then",
                               snapshot_id=snap["id"]))["volume"]

            # refused before a VM starts (rift_vm_new's volumes): no guest is booted
            busy = await refused(s, "volume_busy", "rift_vm_new", handle=handle_b,
                                 image="tiny", volumes=[{"volume_id": vol["id"],
                                                         "path": "/work", "read_only": True}])
            assert (busy["vm_id"], busy["task_id"]) == (vm_a, task_a), busy
            gone = await refused(s, "volume_busy", "rift_volume_delete", volume_id=vol["id"])
            assert "rift_vm_detach_volume" in gone["hint"], gone
            bad = await refused(s, "invalid_argument", "rift_vm_new", handle=handle_b,
                                image="tiny", volumes=[{"volume_id": vol["id"],
                                                        "path": "/etc/work"}])
            assert bad["field"] == "path", bad

            closed = await call(s, "rift_task_close", handle=handle_a)
            assert closed["destroyed"] == [vm_a], closed
            kept = (await call(s, "rift_volume_get", volume_id=vol["id"]))["volume"]
            assert kept["attached_to"] == [] and kept["size_gib"] == 2, kept

            vm = (await call(s, "rift_vm_new", handle=handle_b, image="tiny", volumes=[
                {"volume_id": vol["id"], "path": "/mnt/work", "read_only": True}]))["vm"]
            assert vm["status"] == "running", vm
            assert vm["volumes"] == [{"volume_id": vol["id"], "path": "/mnt/work",
                                      "read_only": True}], vm
            vm_b = vm["id"]
            read = await call(s, "rift_vm_read_file", handle=handle_b, vm_id=vm_b,
                              path="/mnt/work/notes.txt")
            assert read["content"] == "kept across tasks\n", read
            # a clone while it reads puts the volume's file on a frozen parent: a pause
            # and resume opens it along that chain, not the one libvirt had recorded
            copy = (await call(s, "rift_volume_clone", volume_id=vol["id"],
                               name="copy"))["volume"]
            await call(s, "rift_vm_pause", handle=handle_b, vm_id=vm_b)
            await call(s, "rift_vm_resume", handle=handle_b, vm_id=vm_b)
            await _sh(s, handle_b, vm_b, "echo 3 > /proc/sys/vm/drop_caches")
            again = await _sh(s, handle_b, vm_b, "cat /mnt/work/notes.txt")
            assert again == "kept across tasks\n", again
            await call(s, "rift_volume_delete", volume_id=copy["id"])
            modes = await _sh(s, handle_b, vm_b, "stat -c '%a %n' /mnt/work/notes.txt "
                              "/mnt/work/secret /mnt/work/secret/key")
            assert modes.split("\n")[:3] == ["640 /mnt/work/notes.txt", "700 /mnt/work/secret",
                                             "600 /mnt/work/secret/key"], modes
            ro = await call(s, "rift_vm_exec", handle=handle_b, vm_id=vm_b,
                            command="touch /mnt/work/new")
            assert ro["exit_code"] != 0 and "Read-only" in ro["stderr"], ro
            # the clone of the snapshot's copy outlived the snapshot (task A closed)
            await _attach(s, handle_b, vm_b, volume_id=then["id"], path="/mnt/then",
                          read_only=True)
            after = await _sh(s, handle_b, vm_b, "ls -A /mnt/work")
            assert "after.txt" in after.split(), after  # the volume has what came after
            kept = await _sh(s, handle_b, vm_b, "ls -A /mnt/then; cat /mnt/then/notes.txt")
            assert kept.split("\n")[:4] == ["lost+found", "notes.txt", "secret",
                                            "kept across tasks"], kept
            await call(s, "rift_vm_detach_volume", handle=handle_b, vm_id=vm_b,
                       volume_id=then["id"])
            await call(s, "rift_volume_delete", volume_id=then["id"])

            vm = (await call(s, "rift_vm_detach_volume", handle=handle_b, vm_id=vm_b,
                             volume_id=vol["id"]))["vm"]
            assert vm["volumes"] == [], vm
            left = await _sh(s, handle_b, vm_b, "grep -c ' /mnt/work ' /proc/mounts || true")
            assert left.strip() == "0", left
            await call(s, "rift_volume_delete", volume_id=vol["id"])
            assert (await call(s, "rift_volume_list"))["volumes"] == []
            await call(s, "rift_task_close", handle=handle_b)
            assert task_b

    run(scenario, LIMIT_S)
    print(f"attach and mount: {', '.join(f'{t:.2f} s' for t in took)}")
    assert max(took) < 5, took  # the goal is 1 s under TCG; a busy shared machine is slower


@long_form("tests/unit/test_fork_volumes.py and tests/integration/test_volume_forks_libvirt.py")
def test_a_fork_gets_the_read_only_volumes_and_not_the_written_one(real: Server) -> None:
    """A fork of a running `tiny` VM holding one volume writable and one read-only:
    the fork's view and guest hold the read-only one (its files there), not the
    written one (unmounted, unplugged: its stand-in gone), while the source goes on
    writing its own; closing both tasks leaves both volumes detached."""

    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            written = (await call(s, "rift_volume_new", name="fw", size_gib=1))["volume"]
            shared = (await call(s, "rift_volume_new", name="fr", size_gib=1))["volume"]
            _task, handle, vm_id = await _vm(s, "fork source")
            await _attach(s, handle, vm_id, volume_id=shared["id"], path="/r")
            await _sh(s, handle, vm_id, "echo shared > /r/s.txt && sync")
            await call(s, "rift_vm_detach_volume", handle=handle, vm_id=vm_id,
                       volume_id=shared["id"])
            await _attach(s, handle, vm_id, volume_id=shared["id"], path="/r", read_only=True)
            await _attach(s, handle, vm_id, volume_id=written["id"], path="/w")
            await _sh(s, handle, vm_id, "echo before > /w/a.txt && sync")

            (fork,) = (await call(s, "rift_vm_fork", handle=handle, vm_id=vm_id))["vms"]
            assert fork["status"] == "running", fork["error"]
            assert fork["volumes"] == [{"volume_id": shared["id"], "path": "/r",
                                        "read_only": True}], fork["volumes"]
            seen = await _sh(s, handle, fork["id"], "cat /r/s.txt; "
                             "grep -c ' /w ' /proc/mounts || true; "
                             "grep ' /r ' /proc/mounts | cut -d' ' -f4 | cut -d, -f1")
            assert seen.split() == ["shared", "0", "ro"], seen
            await _sh(s, handle, vm_id, "echo after > /w/b.txt && sync && ls /w")
            readers = (await call(s, "rift_volume_get", volume_id=shared["id"]))["volume"]
            assert sorted(a["vm_id"] for a in readers["attached_to"]) == sorted(
                [vm_id, fork["id"]]), readers
            await call(s, "rift_task_close", handle=handle)
            for vol in (written, shared):
                got = (await call(s, "rift_volume_get", volume_id=vol["id"]))["volume"]
                assert got["attached_to"] == [], got
                await call(s, "rift_volume_delete", volume_id=vol["id"])

    run(scenario, LIMIT_S)
