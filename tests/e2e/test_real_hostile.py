"""Hostile guests on real `tiny` guests and one `debian` (SPEC §15, issue #26):
mallory is root in her guest and does her worst (a fake exec helper that never
reads its stdin, floods, never answers or prints a view line built for
backtracking; a console flood; a new SSH host key; a full disk; a fork bomb);
each time her own call fails with `guest_unreachable` (or answers) within its
deadline, and a probe shows that alice's `rift_vm_exec` and `rift_task_get` and
`/healthz` kept answering meanwhile, each well within PROBE_BOUND_S, and that the
sweep kept its beat (the figures against a quiet server are bench/hostile.py's).
Last, `rift serve` stops within 10 s of SIGTERM with a hostile call in flight.
One VM each, kept across the module (mallory's `debian` and her last `tiny` are
new ones)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.hostile import GuestRoot, Probe, Window, one_call, rss_mib
from tests.support.mcp_clients import call, mcp_session, run
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import Server, real_vms_missing, seed_images, wait_until
from tests.support.soak import long_form
from tests.support.witnesses import rows

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

WAIT_S = 2  # mallory's exec wait: her call's deadline is this and the helper's slack
SLACK_S = 5  # the server's RIFT_HELPER_SLACK_S here (15 by default): a helper call's
# deadline past its wait, which a stalled helper costs mallory's call
DEADLINE_S = WAIT_S + SLACK_S + 5  # generous under TCG
PROBE_BOUND_S = 5.0  # alice's slowest call while mallory does her worst (minutes, unfixed)
GROWTH_MIB = 64  # what a flooding guest may cost `rift serve` in memory at most
CUT_S = 8  # past its wait, how soon a flooding helper's call is cut off (TCG)
STOP_S = 10
SWEEP_S = 2  # the server's RIFT_SWEEP_INTERVAL_S here
HEARTBEAT = "sweep heartbeat age"  # the probe's gauge
DEBIAN_BOOT_S = 120  # a `debian` boot on a busy 2-core machine under TCG
DEBIAN_FILL_S = 240  # writing its free space (about 400 MiB) under TCG
CONSOLE_LOG_MIB = 1  # the server's RIFT_CONSOLE_LOG_MIB here
FLOOD_BYTES = 3 << 20


@dataclass
class Scene:
    rig: Rig
    server: Server
    mallory: str  # tokens
    alice: str
    handles: dict[str, str] = field(default_factory=dict)  # user -> task handle
    vms: dict[str, dict[str, Any]] = field(default_factory=dict)  # user -> VM view
    probe: Probe | None = None

    @property
    def proc(self) -> subprocess.Popen[str]:
        return self.rig.proc

    def root(self) -> GuestRoot:
        task_id = self.handles["mallory_task"]
        return GuestRoot(self.vms["mallory"]["ssh"]["port"],
                         self.server.data_dir / "keys" / task_id)


async def _task_and_vm(url: str, token: str, name: str) -> tuple[str, str, dict[str, Any]]:
    async with mcp_session(url, token, name) as s:
        opened = await call(s, "rift_task_new", name=name)
        vm = (await call(s, "rift_vm_new", handle=opened["handle"], image="tiny"))["vm"]
        assert vm["status"] == "running", vm
        return opened["handle"], opened["task"]["id"], vm


REAL = RealSettings(env={"RIFT_VM_BOOT_TIMEOUT_S": str(DEBIAN_BOOT_S),
                         "RIFT_HELPER_SLACK_S": str(SLACK_S),
                         "RIFT_SWEEP_INTERVAL_S": str(SWEEP_S),
                         "RIFT_CONSOLE_LOG_MIB": str(CONSOLE_LOG_MIB)})


@pytest.fixture(scope="module")
def scene(rig: Rig) -> Iterator[Scene]:
    srv = rig.server
    made = Scene(rig, srv, srv.new_token("mallory", "hostile"), srv.new_token("alice", "probe"))
    try:
        for user, token in (("mallory", made.mallory), ("alice", made.alice)):
            handle, task_id, vm = run(functools.partial(_task_and_vm, srv.url, token, user),
                                      300)
            made.handles[user], made.handles[f"{user}_task"], made.vms[user] = (
                handle, task_id, vm)
        made.root().spawn(f"yes console flood | head -c {FLOOD_BYTES} > /dev/console; "
                          "touch /tmp/flooded")
        made.probe = Probe(srv.url, made.alice, made.handles["alice"],
                           made.vms["alice"]["id"],
                           gauges={HEARTBEAT: functools.partial(_heartbeat_age, srv)}).start()
        yield made
    finally:
        if made.probe is not None:
            made.probe.stop()
        _tidy(made)


def _tidy(made: Scene) -> None:
    """Close both tasks on a fresh `rift serve` (the module's may be frozen or
    stopped by now); the rig then checks that no domain is left (removing any that is)."""
    again = made.rig.restart()

    async def close() -> None:
        for user in ("mallory", "alice"):
            if user in made.handles:
                token = made.mallory if user == "mallory" else made.alice
                async with mcp_session(again.url, token) as s:
                    await call(s, "rift_task_close", handle=made.handles[user])

    run(close, 120)


# -- mallory's calls and the probe's verdict ---------------------------------------------

def _mallory(scene: Scene, tool: str, limit_s: float = DEADLINE_S + 30,
             **args: Any) -> tuple[str | None, float, dict[str, Any]]:
    """Mallory's call on her task (see `one_call`)."""
    return one_call(scene.server.url, scene.mallory, tool, limit_s,
                    handle=scene.handles["mallory"], **args)


def _exec(scene: Scene, command: str, **args: Any) -> tuple[str | None, float,
                                                          dict[str, Any]]:
    return _mallory(scene, "rift_vm_exec", vm_id=scene.vms["mallory"]["id"],
                    command=command, **args)


def _heartbeat_age(srv: Server) -> float:
    """Seconds since the sweep's last heartbeat (rift.services.background.heartbeat), read
    from the server's store."""
    beat = rows(srv, "SELECT value FROM meta WHERE key = 'heartbeat_at'")[0]["value"]
    return (datetime.now(UTC) - datetime.fromisoformat(beat)).total_seconds()


def _assert_alice_unharmed(window: Window) -> None:
    """Alice's calls all answered, each within PROBE_BOUND_S, and the sweep kept
    its beat (its last heartbeat never older than SWEEP_S + PROBE_BOUND_S)."""
    ages = window.seconds(HEARTBEAT)
    assert ages and ages[-1] < SWEEP_S + PROBE_BOUND_S, f"the sweep's heartbeat ages: {ages}"
    window = Window([s for s in window.samples if s.kind != HEARTBEAT])
    for kind in ("rift_vm_exec", "rift_task_get", "/healthz"):
        assert window.of(kind), f"the probe made no {kind} call meanwhile"
    assert not window.failures(), window.failures()[:3]
    assert window.slowest() < PROBE_BOUND_S, (
        f"alice waited {window.slowest():.1f} s: "
        + ", ".join(f"{k} p99 {window.p99(k):.2f} s" for k in
                    ("rift_vm_exec", "rift_task_get", "/healthz")))


def _assert_mallory_mended(scene: Scene) -> None:
    """Mallory's VM answers an exec again once the real helper is back (nothing of
    hers stayed pinned)."""
    code, took, done = _exec(scene, "echo back")
    assert code is None and done.get("stdout") == "back\n", (code, done)
    assert took < DEADLINE_S, took


def _fake_helper_case(scene: Scene, fake: str, command: str = "true",
                      **args: Any) -> tuple[str | None, float]:
    assert scene.probe is not None
    root = scene.root()
    root.fake_helper(fake)
    try:
        with scene.probe.window() as window:
            code, took, _ = _exec(scene, command, wait_s=WAIT_S, **args)
    finally:
        root.real_helper()
    assert (code, took < DEADLINE_S) == ("guest_unreachable", True), (code, took)
    _assert_alice_unharmed(window)
    return code, took


# -- the cases ----------------------------------------------------------------------------

def test_a_fake_helper_that_never_reads_a_large_stdin_fails_its_call_and_pins_nothing(
        scene: Scene) -> None:
    _fake_helper_case(scene, "silent", "cat", stdin="x" * (8 << 20))
    _assert_mallory_mended(scene)


def test_a_fake_helper_with_endless_output_is_cut_off_at_its_cap_not_read_to_the_deadline(
        scene: Scene) -> None:
    """Read whole until the deadline, the flood would cost `rift serve` what the
    guest sends in WAIT_S + SLACK_S (tens of MiB under TCG, far more under KVM);
    cut at the call's cap it fails as soon as the cap is passed."""
    before = rss_mib(scene.proc.pid, "VmHWM")
    _, took = _fake_helper_case(scene, "endless")
    after = rss_mib(scene.proc.pid, "VmHWM")
    assert took < WAIT_S + CUT_S, took
    assert after - before < GROWTH_MIB, (before, after)
    _assert_mallory_mended(scene)


def test_a_fake_helper_that_never_exits_fails_its_call_within_its_deadline(
        scene: Scene) -> None:
    _fake_helper_case(scene, "silent")
    _assert_mallory_mended(scene)


def test_a_fake_helper_printing_a_line_built_for_backtracking_fails_its_call_at_once(
        scene: Scene) -> None:
    _fake_helper_case(scene, "catastrophic")
    _assert_mallory_mended(scene)


def test_a_console_flood_slows_nobody_and_its_log_stays_bounded(scene: Scene) -> None:
    """The flood began with the module (FLOOD_BYTES to the console, slow under TCG:
    about 32 KB/s): mallory's execs answer meanwhile, and once it is over her
    console log on disk is within RIFT_CONSOLE_LOG_MIB."""
    assert scene.probe is not None
    log = scene.server.data_dir / "serial" / f"{scene.vms['mallory']['id']}.log"
    assert log.exists(), log
    root = scene.root()
    with scene.probe.window() as window:
        for _ in range(3):
            code, took, done = _exec(scene, "echo still")
            assert (code, done.get("stdout")) == (None, "still\n"), (code, done)
            assert took < DEADLINE_S, took
            time.sleep(2)
    _assert_alice_unharmed(window)
    wait_until(lambda: root.run("[ -e /tmp/flooded ]", 10)[0] == 0, 150,
               "the end of the console flood")
    assert log.stat().st_size <= (CONSOLE_LOG_MIB << 20) + (64 << 10), log.stat().st_size


def test_a_guest_that_changes_its_host_key_fails_its_own_calls_and_no_one_elses(
        scene: Scene) -> None:
    assert scene.probe is not None
    root = scene.root()
    root.change_host_key()
    with scene.probe.window() as window:
        code, took, _ = _exec(scene, "true", wait_s=WAIT_S)
    assert (code, took < DEADLINE_S) == ("guest_unreachable", True), (code, took)
    _assert_alice_unharmed(window)
    root.change_host_key(back=True)
    _assert_mallory_mended(scene)


def test_a_guest_that_fills_its_disk_gets_an_answer_and_slows_no_one(scene: Scene) -> None:
    """`tiny` has no disk: its root is a tmpfs, filled here to the last block (the
    exec helper keeps each exec's output there)."""
    assert scene.probe is not None
    root = scene.root()
    root.run("dd if=/dev/zero of=/fill bs=1M; sync", 120)
    try:
        with scene.probe.window() as window:
            code, took, done = _exec(scene, "echo full; df /", wait_s=WAIT_S)
        assert code in (None, "guest_unreachable"), (code, done)
        assert took < DEADLINE_S, took
        _assert_alice_unharmed(window)
    finally:
        root.must("rm -f /fill")
    _assert_mallory_mended(scene)


@long_form("test_a_guest_that_fills_its_disk_gets_an_answer_and_slows_no_one, on tiny")
def test_a_debian_guest_that_fills_its_disk_still_answers_and_its_overlay_stays_bounded(
        scene: Scene) -> None:
    """A `debian` VM of mallory's writes zeros until its root file system is full:
    her exec answers (its helper keeps its files in /run, a tmpfs), alice is
    unharmed, the overlay on the host grows no further than the disk's size, and
    destroying the VM removes it. The long form (about 85 s: a `debian` boot and
    400 MiB written under TCG) of the `tiny` case above."""
    assert scene.probe is not None
    seed_images(scene.server.data_dir, debian=True)  # skips where it cannot be built
    code, _, made = _mallory(scene, "rift_vm_new", limit_s=DEBIAN_BOOT_S + 60,
                             image="debian")
    assert code is None, made
    vm = made["vm"]
    root = GuestRoot(vm["ssh"]["port"],
                     scene.server.data_dir / "keys" / scene.handles["mallory_task"])
    size = int(root.must("blockdev --getsize64 /dev/vda").strip())
    with scene.probe.window() as window:
        root.run("dd if=/dev/zero of=/fill bs=1M; sync", DEBIAN_FILL_S)
        code, took, done = _mallory(scene, "rift_vm_exec", vm_id=vm["id"],
                                    command="df --output=pcent / | tail -1", wait_s=WAIT_S)
    assert code is None and done["stdout"].strip() == "100%", (code, done)
    assert took < DEADLINE_S, took
    _assert_alice_unharmed(window)
    overlay = next(scene.server.data_dir.rglob(f"{vm['id']}.qcow2"))
    assert overlay.stat().st_size <= size * 1.05, (overlay.stat().st_size, size)
    code, _, gone = _mallory(scene, "rift_vm_destroy", vm_id=vm["id"])
    assert code is None and gone["vm"]["status"] == "destroyed", (code, gone)
    assert not overlay.exists(), overlay


def test_a_fork_bomb_costs_its_own_vm_only_and_the_vm_is_still_destroyed(
        scene: Scene) -> None:
    assert scene.probe is not None
    scene.root().spawn("f() { f | f & }; f")
    time.sleep(3)
    with scene.probe.window() as window:
        code, took, _ = _exec(scene, "true", wait_s=WAIT_S)
        assert code in (None, "guest_unreachable"), code
        assert took < DEADLINE_S + 10, took  # its SSH login may be what times out
        gone_code, gone_took, gone = _mallory(scene, "rift_vm_destroy",
                                              vm_id=scene.vms["mallory"]["id"])
    assert gone_code is None and gone["vm"]["status"] == "destroyed", (gone_code, gone)
    assert gone_took < 30, gone_took
    _assert_alice_unharmed(window)


def test_rift_serve_stops_within_ten_seconds_of_sigterm_with_a_hostile_call_in_flight(
        scene: Scene) -> None:
    """Mallory's new VM gets a helper that never reads and never exits, and a call
    with 8 MiB of stdin is in flight on it when `rift serve` is told to stop."""
    code, _, made = _mallory(scene, "rift_vm_new", image="tiny")
    assert code is None, made
    scene.vms["mallory"] = made["vm"]
    scene.root().fake_helper("silent")

    def in_flight() -> None:
        with contextlib.suppress(Exception):  # the server goes away under it
            _exec(scene, "cat", stdin="x" * (8 << 20), wait_s=30)

    threading.Thread(target=in_flight, daemon=True).start()
    time.sleep(3)
    began = time.monotonic()
    os.kill(scene.proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        scene.proc.wait(STOP_S + 20)
    took = time.monotonic() - began
    assert scene.proc.poll() is not None and took <= STOP_S, f"still running after {took:.1f} s"

