"""Pools on real guests (SPEC §11): `rift serve` on qemu:///system under TCG keeps
`tiny` VMs (and in `make soak` `debian` ones too) ready, booted (`--running`) and saved by libvirt
(`--saved`); `rift_vm_new` through the official MCP SDK client takes one and
answers with a guest that execs under the task's key: the pool key is gone from
it (a new login takes the task's key and no pool's), its clock is the host's,
and no two VMs share a host key or entropy; a pooled or saved `debian` VM comes
with its default code context's kernel running (SPEC §20). A VM reset from inside comes back
with its pool's key and is handed over again. The hand-out's
time is printed (no timed assertion: the machine is shared); `make bench` has
the figures side by side."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from mcp.client.session import ClientSession

from rift.guest.exec_view import parse_view, start_command
from rift.services.ports import ExecStart
from tests.support.mcp_clients import call, mcp_session, run
from tests.support.real_guests import RealSettings
from tests.support.servers import Server, logs_in, real_vms_missing, wait_until
from tests.support.soak import scale

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

BOOT_S = 120
FILL_S = 600  # four boots and two saves under TCG on a busy 2-core machine
HOST_KEY = {"tiny": "dropbearkey -y -f /etc/dropbear/dropbear_ed25519_host_key | grep ^ssh-",
            "debian": "cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub"}


def _clear_pools(srv: Server) -> None:
    srv.rift("pool", "clear", "tiny")
    srv.rift("pool", "clear", "debian")


REAL = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": str(BOOT_S), "RIFT_SWEEP_INTERVAL_S": "5"},
                    debian=scale(False, True),  # `debian`'s pools are the long form (below)
                    before_stop=_clear_pools)


def _pools(srv: Server) -> list[dict[str, Any]]:
    listed = srv.rift("pool", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout))


def _filled(srv: Server) -> bool:
    rows = _pools(srv)
    return bool(rows) and all(r["running"]["ready"] == r["running"]["want"]
                              and r["saved"]["ready"] == r["saved"]["want"] for r in rows)


async def _exec(s: ClientSession, handle: str, vm_id: str, command: str) -> str:
    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command=command,
                      timeout_s=60)
    assert done["exit_code"] == 0, done
    return str(done["stdout"])


async def _reboot(s: ClientSession, handle: str, vm_id: str, authorized: str) -> None:
    """Reset the guest from inside (its kernel command line brings the pool's key
    back) and wait until Rift execs in it again: it pins the host key the guest
    printed on its console and hands the VM over anew, so the task's key alone
    opens it, as before."""
    boot_id = await _exec(s, handle, vm_id, "cat /proc/sys/kernel/random/boot_id")
    cut = await s.call_tool("rift_vm_exec", {"handle": handle, "vm_id": vm_id, "timeout_s": 5,
                                             "command": "echo b > /proc/sysrq-trigger"})
    assert cut.is_error or cut.structured_content is not None  # cut off, or timed out
    deadline = time.monotonic() + BOOT_S
    while True:
        done = await s.call_tool("rift_vm_exec", {
            "handle": handle, "vm_id": vm_id, "timeout_s": 30,
            "command": "cat /proc/sys/kernel/random/boot_id"})
        content = done.structured_content or {}
        if not done.is_error and content.get("exit_code") == 0 \
                and content["stdout"] != boot_id:
            break
        if done.is_error:  # the guest is still coming back
            assert content["error"]["code"] == "guest_unreachable", content
        assert time.monotonic() < deadline, f"no exec after the reboot: {content}"
        await asyncio.sleep(1)
    assert await _exec(s, handle, vm_id, "cat /root/.ssh/authorized_keys") == authorized


# Each start kind gets its own size, so a pool's refill never answers another's call.
# `debian`'s pools are the long form (about 60 s of the test's 85), in make soak only;
# make test hands out a saved `debian` in test_real_hosts.py (pools on hosts elsewhere).
SIZES = {"tiny": {"pool": 256, "restore": 320, "boot": 384},
         **scale({}, {"debian": {"pool": 576, "restore": 512, "boot": 640}})}


@pytest.mark.soak
@pytest.mark.timeout(FILL_S + 600)
def test_pooled_and_saved_vms_are_handed_out_with_the_tasks_key_and_the_hosts_clock(
        real: Server) -> None:
    for image, sizes in SIZES.items():
        for goal, kind in (("--running", "pool"), ("--saved", "restore")):
            made = real.rift("pool", "set", image, goal, "1",
                             "--memory-mib", str(sizes[kind]))
            assert made.returncode == 0, made.stderr
    wait_until(lambda: _filled(real), FILL_S, "the pools are filled", every_s=1)
    took: dict[str, float] = {}
    skew: dict[str, float] = {}

    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            opened = await call(s, "rift_task_new", name="pools")
            handle = opened["handle"]
            keys: set[str] = set()
            entropy: set[str] = set()
            for image, sizes in SIZES.items():
                for kind, memory_mib in sizes.items():
                    started = time.monotonic()
                    vm = (await call(s, "rift_vm_new", handle=handle, image=image,
                                     memory_mib=memory_mib))["vm"]
                    took[f"{image} {kind} ({memory_mib} MiB): the answer"] = \
                        time.monotonic() - started
                    assert vm["status"] == "running" and vm["start"]["kind"] == kind, vm
                    asked = time.time()
                    clock = int(await _exec(s, handle, vm["id"], "date +%s"))
                    answered = time.time()
                    took[f"{image} {kind} ({memory_mib} MiB): the first exec"] = \
                        time.monotonic() - started
                    # The guest read its clock (whole seconds) while the exec was under way.
                    off = 0.0 if asked - 1 <= clock <= answered else min(
                        abs(clock - asked + 1), abs(clock - answered))
                    skew[f"{image} {kind}"] = off
                    if kind != "boot":  # a hand-out sets it (a cold boot reads the RTC)
                        assert off <= 1, (image, kind, clock, asked, answered)
                    authorized = await _exec(s, handle, vm["id"],
                                             "cat /root/.ssh/authorized_keys")
                    assert len(authorized.splitlines()) == 1  # the task's key alone
                    # A new login takes the task's key, and no pool's key any more.
                    port = vm["ssh"]["port"]
                    assert logs_in(port, real.data_dir / "keys" / opened["task"]["id"])
                    for pool_key in (real.data_dir / "keys").glob("pool_*"):
                        assert not logs_in(port, pool_key), (image, kind, pool_key.name)
                    if kind == "pool":
                        await _reboot(s, handle, vm["id"], authorized)
                        for pool_key in (real.data_dir / "keys").glob("pool_*"):
                            assert not logs_in(port, pool_key), (image, "reboot")
                    keys.add((await _exec(s, handle, vm["id"], HOST_KEY[image])).strip())
                    # The exec helper the image carries runs in it (its keeper under
                    # the guest's own init and shell).
                    helped = parse_view((await _exec(s, handle, vm["id"], start_command(ExecStart(
                        exec_id="exec_pooltest", command="echo $((6 * 7))", timeout_s=60,
                        cap_bytes=4096, wait_ms=20000, max_bytes=4096)))).encode(), 4096)
                    assert (helped.state, helped.exit_code, helped.stdout) == \
                        ("ended", 0, b"42\n"), (image, kind, helped)
                    if image == "debian" and kind != "boot":  # SPEC §20: a kernel ready
                        contexts = (await call(s, "rift_vm_code_context_list", handle=handle,
                                               vm_id=vm["id"]))["contexts"]
                        assert [(x["id"], x["alive"]) for x in contexts] == \
                            [("default", True)], (kind, contexts)
                        began = time.monotonic()
                        ran = (await call(s, "rift_vm_run_code", handle=handle,
                                          vm_id=vm["id"], code="6 * 7"))["execution"]
                        took[f"{image} {kind}: the first run_code"] = time.monotonic() - began
                        assert ran["results"][0]["data"]["text/plain"] == "42", ran
                    entropy.add(await _exec(s, handle, vm["id"],
                                            "head -c 16 /dev/urandom | od -An -tx1"))
                    await call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
            assert len(keys) == 3 * len(SIZES)  # no two VMs share a host key
            assert len(entropy) == 3 * len(SIZES)  # nor what their entropy pools give
            await call(s, "rift_task_close", handle=handle)

    run(scenario, limit_s=900)
    for what, seconds in sorted(took.items()):
        print(f"{what}: {seconds:.2f} s")
    for what, seconds in sorted(skew.items()):
        print(f"{what}: the guest's clock {seconds:.1f} s off the host's (beyond the exec)")
