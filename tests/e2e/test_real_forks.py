"""Snapshots and forks on real guests (SPEC §12), through the official MCP SDK
client: forks of a `tiny` snapshot have its processes and files, and each its own
host key, MAC, clock and entropy (two forks read different bytes from
/dev/urandom right after the fork); a `debian` VM comes back from a pause with
its files and processes, and a fork of it running has its files and a disk of
its own; the snapshot's files go with it. An image made from a snapshot
(`rift image add NAME --snapshot`) starts another user's VMs, pooled or not, from
its state, each with its own key and identity."""

from __future__ import annotations

import base64
import io
import json
import math
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession

from tests.support.mcp_clients import call, mcp_session, run
from tests.support.pools import fill_pool
from tests.support.real_guests import RealSettings
from tests.support.servers import COUNTER, Server, logs_in, real_vms_missing, wait_until
from tests.support.soak import long_form

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 300


def _no_snapshot_files(srv: Server) -> None:
    left = list((srv.data_dir / "snapshots").glob("*"))
    assert not left, f"snapshot files left behind: {left}"


REAL = RealSettings(debian=True, env={"RIFT_VM_BOOT_TIMEOUT_S": "120",
                                      "RIFT_SWEEP_INTERVAL_S": "2"},
                    after_stop=_no_snapshot_files)


async def _sh(s: ClientSession, handle: str, vm_id: str, command: str) -> str:
    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command=command)
    assert (done["status"], done["exit_code"]) == ("exited", 0), done
    return str(done["stdout"]).strip()


async def _identity(s: ClientSession, handle: str, vm_id: str, key_command: str
                    ) -> dict[str, Any]:
    """What tells one guest from another, the entropy read first."""
    entropy = await _sh(s, handle, vm_id, "head -c 16 /dev/urandom | od -An -tx1")
    before = time.time()
    clock = int(await _sh(s, handle, vm_id, "date +%s"))
    after = time.time()
    # Within a second of the host's, at `date +%s`'s whole seconds.
    assert math.floor(before) - 1 <= clock <= after + 1, (vm_id, before, clock, after)
    return {"entropy": entropy,
            "mac": await _sh(s, handle, vm_id, "cat /sys/class/net/eth0/address"),
            "host_key": await _sh(s, handle, vm_id, key_command)}


def test_forks_of_a_tiny_snapshot_have_its_processes_and_files_and_their_own_identity(
        real: Server) -> None:
    key = "dropbearkey -y -f /etc/dropbear/dropbear_ed25519_host_key | grep ^ssh-"

    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="forks"))["handle"]
            source = (await call(s, "rift_vm_new", handle=handle, image="tiny"))["vm"]["id"]
            await call(s, "rift_vm_write_file", handle=handle, vm_id=source,
                       path="/root/state", content="before the snapshot\n")
            await call(s, "rift_vm_exec", handle=handle, vm_id=source, wait_s=1,
                       timeout_s=3600, command=COUNTER)
            snap = (await call(s, "rift_vm_snapshot", handle=handle, vm_id=source,
                               name="counting"))["snapshot"]
            assert snap["id"].startswith("snap_") and snap["bytes"] > 0, snap
            task = (await call(s, "rift_task_get", handle=handle))["task"]
            assert [x["id"] for x in task["snapshots"]] == [snap["id"]]
            forks = (await call(s, "rift_vm_fork", handle=handle, snapshot_id=snap["id"],
                                count=2))["vms"]
            assert [f["status"] for f in forks] == ["running", "running"], forks
            assert all(f["start"]["kind"] == "fork" for f in forks)
            identities = [await _identity(s, handle, f["id"], key) for f in forks]
            identities.append(await _identity(s, handle, source, key))
            for what in ("entropy", "mac", "host_key"):
                values = [i[what] for i in identities]
                assert len(set(values)) == 3, (what, values)
            for fork in forks:
                assert await _sh(s, handle, fork["id"], "cat /root/state") == \
                    "before the snapshot"
                first = int(await _sh(s, handle, fork["id"], "cat /tmp/count"))
                time.sleep(0.6)
                assert int(await _sh(s, handle, fork["id"], "cat /tmp/count")) > first
            # A file written in one fork is its own.
            await call(s, "rift_vm_write_file", handle=handle, vm_id=forks[0]["id"],
                       path="/root/mine", content="fork 0\n")
            assert await _sh(s, handle, forks[1]["id"], "cat /root/mine 2>/dev/null; true") \
                == ""
            gone = (await call(s, "rift_vm_snapshot_delete", handle=handle,
                               snapshot_id=snap["id"]))["snapshot"]
            assert gone["id"] == snap["id"]
            assert not (real.data_dir / "snapshots" / snap["id"]).exists()
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S * 2)


def test_a_debian_vm_pauses_and_a_fork_of_it_running_has_its_files_and_a_disk_of_its_own(
        real: Server) -> None:
    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="debian fork"))["handle"]
            source = (await call(s, "rift_vm_new", handle=handle, image="debian"))["vm"]["id"]
            await _sh(s, handle, source, "echo on disk > /root/before && sync")
            await call(s, "rift_vm_exec", handle=handle, vm_id=source, wait_s=0,
                       timeout_s=3600, command=COUNTER)
            counted = int(await _sh(s, handle, source, "sleep 0.5; cat /tmp/count"))
            # A pause and resume first: the VM comes back with its files and processes.
            assert (await call(s, "rift_vm_pause", handle=handle, vm_id=source))["vm"][
                "status"] == "paused"
            assert (await call(s, "rift_vm_resume", handle=handle, vm_id=source))["vm"][
                "status"] == "running"
            assert await _sh(s, handle, source, "cat /root/before") == "on disk"
            assert int(await _sh(s, handle, source, "sleep 0.5; cat /tmp/count")) > counted
            skew = int(await _sh(s, handle, source, "date +%s")) - time.time()
            assert abs(skew) <= 2, f"the clock is {skew:.1f} s off after a resume"
            asked = time.monotonic()
            fork = (await call(s, "rift_vm_fork", handle=handle, vm_id=source))["vms"][0]
            assert fork["status"] == "running" and fork["start"]["kind"] == "fork", fork
            assert await _sh(s, handle, fork["id"], "cat /root/before") == "on disk"
            print(f"\ndebian fork: {time.monotonic() - asked:.2f} s from the call to its "
                  f"first exec ({fork['start']['ms']} ms to running)")
            await _sh(s, handle, fork["id"], "echo fork only > /root/after && sync")
            assert await _sh(s, handle, source, "cat /root/after 2>/dev/null; true") == ""
            assert "Python" in await _sh(s, handle, fork["id"], "python3 --version")
            task = (await call(s, "rift_task_get", handle=handle))["task"]
            assert task["snapshots"] == []  # the fork's own snapshot went after it
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S * 2)


@long_form("tests/unit/test_snapshot_images.py (the image's files, its VMs started from "
           "its state with identities of their own) and the recipe-built image below "
           "(real VMs restored from a saved image)")
def test_an_image_made_from_a_snapshot_starts_every_users_vms_from_its_state(
        real: Server) -> None:
    key = "dropbearkey -y -f /etc/dropbear/dropbear_ed25519_host_key | grep ^ssh-"
    other_user = real.new_token("bea", "snapshot images")
    image_dir = real.data_dir / "images" / "counting"

    async def make_snapshot() -> str:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="a state to share"))["handle"]
            source = (await call(s, "rift_vm_new", handle=handle, image="tiny",
                                 memory_mib=320))["vm"]["id"]
            await call(s, "rift_vm_write_file", handle=handle, vm_id=source,
                       path="/root/state", content="from the image\n")
            await call(s, "rift_vm_exec", handle=handle, vm_id=source, wait_s=1,
                       timeout_s=3600, command=COUNTER)
            snap = (await call(s, "rift_vm_snapshot", handle=handle, vm_id=source))["snapshot"]
            refused = real.rift("image", "add", "tiny", "--snapshot", snap["id"])
            assert refused.returncode != 0 and "built by Rift" in refused.stderr
            made = real.rift("image", "add", "counting", "--snapshot", snap["id"])
            assert made.returncode == 0, made.stderr
            # The image is a copy: the snapshot's task closes, its files go, the image stays.
            await call(s, "rift_task_close", handle=handle)
            return str(snap["id"])

    snapshot_id = run(make_snapshot, LIMIT_S)
    assert not (real.data_dir / "snapshots" / snapshot_id).exists()
    listed = json.loads(real.rift("image", "list", "--json").stdout)
    assert {"name": "counting", "kind": "snapshot", "built": "yes"} in listed

    async def use_image() -> None:
        async with mcp_session(real.url, other_user, "claude-code") as s:
            opened = await call(s, "rift_task_new", name="from the image")
            handle = opened["handle"]
            refused = await s.call_tool("rift_vm_new", {"handle": handle, "image": "counting",
                                                        "memory_mib": 512})
            error = (refused.structured_content or {})["error"]
            assert (error["code"], error["field"]) == ("invalid_argument", "memory_mib"), error
            vms = [(await call(s, "rift_vm_new", handle=handle, image="counting"))["vm"]]
            fill_pool(real, "counting")
            vms.append((await call(s, "rift_vm_new", handle=handle, image="counting"))["vm"])
            assert [vm["start"]["kind"] for vm in vms] == ["fork", "pool"], vms
            identities = set()
            for vm in vms:
                assert (vm["status"], vm["memory_mib"]) == ("running", 320), vm
                assert await _sh(s, handle, vm["id"], "cat /root/state") == "from the image"
                first = int(await _sh(s, handle, vm["id"], "cat /tmp/count"))
                time.sleep(0.6)
                assert int(await _sh(s, handle, vm["id"], "cat /tmp/count")) > first
                identities.add(tuple((await _identity(s, handle, vm["id"], key)).values()))
                # Root takes this task's key alone: the image's key is refused now.
                port = vm["ssh"]["port"]
                assert logs_in(port, real.data_dir / "keys" / opened["task"]["id"])
                assert not logs_in(port, image_dir / "key")
            assert len(identities) == 2
            in_use = real.rift("image", "remove", "counting")
            assert in_use.returncode != 0 and "in use" in in_use.stderr
            await call(s, "rift_task_close", handle=handle)

    run(use_image, LIMIT_S * 2)
    assert real.rift("pool", "clear", "counting").returncode == 0
    wait_until(lambda: real.rift("image", "remove", "counting").returncode == 0, 60,
               "the image is removed once no VM uses it", every_s=1)
    assert not image_dir.exists()


HELLO = """\
FROM tiny
COPY index.html /srv/www/
EXPOSE 8080
CMD ["httpd", "-f", "-p", "8080", "-h", "/srv/www"]
"""


def _context_tar() -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        page = b"<h1>built from a recipe</h1>\n"
        info = tarfile.TarInfo("index.html")
        info.size = len(page)
        tar.addfile(info, io.BytesIO(page))
    return base64.b64encode(buffer.getvalue()).decode()


def _build(srv: Server, recipe: str, context: str) -> dict[str, Any]:
    """POST /api/v1/images, then its build read until it ends."""
    auth = {"Authorization": f"Bearer {srv.token}"}
    began = httpx.post(f"{srv.url}/api/v1/images", headers=auth, timeout=30,
                       json={"name": "hello", "recipe": recipe, "context": context})
    assert began.status_code == 202, began.text
    build_id = began.json()["build"]["build_id"]

    def ended() -> dict[str, Any] | None:
        got = httpx.get(f"{srv.url}/api/v1/builds/{build_id}", headers=auth, timeout=30)
        build: dict[str, Any] = got.json()["build"]
        return None if build["state"] == "running" else build

    return wait_until(ended, LIMIT_S, "the build ends", every_s=0.2)


def test_an_image_built_from_a_recipe_starts_its_vms_with_its_service_up_and_rebuilds_from_cache(
        real: Server) -> None:
    context = _context_tar()
    started = time.monotonic()
    cold = _build(real, HELLO, context)
    cold_s = time.monotonic() - started
    assert (cold["state"], cold["cached"]) == ("succeeded", 0), cold
    assert "port 8080 answers" in cold["log"]
    started = time.monotonic()
    again = _build(real, HELLO, context)
    assert (again["state"], again["cached"]) == ("succeeded", 3), again
    assert "starting a VM" not in again["log"]
    assert time.monotonic() - started < cold_s / 2, (cold_s, again)

    async def use_image() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="hello"))["handle"]
            vm = (await call(s, "rift_vm_new", handle=handle, image="hello"))["vm"]
            assert vm["start"]["kind"] == "fork", vm  # of the image's saved state
            page = await _sh(s, handle, vm["id"], "wget -q -O - http://127.0.0.1:8080/")
            assert page == "<h1>built from a recipe</h1>"
            await call(s, "rift_task_close", handle=handle)

    run(use_image, LIMIT_S)


@long_form("tests/unit/test_builds.py (the cache, a failed RUN), and the tiny build above")
def test_a_debian_image_builds_its_layers_as_a_chain_of_overlays_and_rebuilds_from_one(
        real: Server, tmp_path: Path) -> None:
    (tmp_path / "note").write_text("copied in\n")
    images = real.data_dir / "images"
    others = {p.name for p in images.glob("layer-*")}  # other tests' images' layers
    recipe = tmp_path / "Recipe"
    recipe.write_text("FROM debian\nRUN echo one > /one\nCOPY note /srv/\n"
                      "RUN cat /srv/note > /two\n")
    built = real.rift("image", "build", "deb", "--recipe", str(recipe), "--context",
                      str(tmp_path))
    assert built.returncode == 0, built.stderr
    recipe.write_text(recipe.read_text().replace("> /two", "> /two; echo again >> /two"))
    again = real.rift("image", "build", "deb", "--recipe", str(recipe), "--context",
                      str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert "step 2/3: COPY note /srv/ (cached)" in again.stdout, again.stdout
    layers = sorted(p for p in images.glob("layer-*/disk.qcow2") if p.parent.name not in others)
    assert len(layers) == 3  # the old last step's went: no image's latest build uses it
    for disk in layers:  # each an overlay on the image its build VM started from
        info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(disk)],
                                         capture_output=True, text=True, check=True).stdout)
        assert info.get("backing-filename"), info
    broken = real.rift("image", "build", "deb", "--recipe", str(recipe), "--context",
                       str(tmp_path), "--no-cache")
    assert broken.returncode == 0, broken.stderr
    assert len({p.name for p in images.glob("layer-*")} - others) == 3  # its own; the rest swept
    recipe.write_text(recipe.read_text() + "RUN exit 7\n")
    failed = real.rift("image", "build", "deb", "--recipe", str(recipe), "--context",
                       str(tmp_path))
    assert failed.returncode == 1 and "line 5: RUN exited 7" in failed.stderr, failed

    async def use_image() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="deb"))["handle"]
            vm = (await call(s, "rift_vm_new", handle=handle, image="deb"))["vm"]
            assert await _sh(s, handle, vm["id"], "cat /one /two") == "one\ncopied in\nagain"
            await call(s, "rift_task_close", handle=handle)

    run(use_image, LIMIT_S)
