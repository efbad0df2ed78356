"""The real-guest harness the e2e modules share (the way firecracker's
tests/framework/microvm.py and its `microvm_factory` fixture serve its suites):

- `RealSettings`: how a module's `rift serve` on qemu:///system is set up (its
  environment, the `debian` image seeded or not, what is prepared in its data dir
  first, what is checked when it stops). A module names its own as `REAL`.
- `Rig`: that one server for the module, as it answers now: `kill()` (`kill -9`),
  `restart(**env)` and `stop()` keep `rig.server` current, so no module keeps its
  own table of processes. Stopping it checks that none of its domains is left (a
  failed test's are removed from the host first).
- `Guests`: the factory that lends a test a running VM (`lend("tiny")`) in a task
  of its own: the same warm VM to each test in turn while the last one gave it
  back running (its running execs killed on the way back), a new one otherwise;
  all closed when the module ends. For tests that do not need a fresh VM.

tests/e2e/conftest.py turns these into the `rig`, `real`, `guests` and `tiny`
fixtures. One server per module: a start costs about 2 s here (the first test's
setup in `--durations`), and modules that agree on settings are few and kill or
restart theirs, so sharing one across modules would buy seconds at the price of
their independence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.mcp_clients import call, mcp_session, run
from tests.support.servers import (
    Server,
    kill_server,
    restart_server,
    start_real_server,
    stop_server,
)
from tests.support.witnesses import our_domains, remove_domain

BOOT_LIMIT_S = 300  # lending a VM: a boot on a busy 2-core machine under TCG


@dataclass(frozen=True)
class RealSettings:
    """How one module's `rift serve` on qemu:///system is set up."""

    env: Mapping[str, str] = field(default_factory=dict)  # RIFT_* over the defaults
    debian: bool = False  # seed the cached `debian` image (built first) beside `tiny`
    prepare: Callable[[Path], object] | None = None  # the data dir, before the start
    before_stop: Callable[[Server], object] | None = None  # e.g. clearing pools
    after_stop: Callable[[Server], object] | None = None  # further checks
    check_left: bool = True  # no domain of this server may be left when it stops


class Rig:
    """One `rift serve` on qemu:///system (see the module's docstring)."""

    def __init__(self, tmp: Path, settings: RealSettings) -> None:
        self.settings = settings
        if settings.prepare is not None:
            settings.prepare(tmp / "data")
        self.proc, self.server = start_real_server(tmp, settings.debian, **settings.env)
        self.first = self.server  # as it started (the data dir and log stay the same)

    @classmethod
    @contextlib.contextmanager
    def started(cls, tmp: Path, settings: RealSettings) -> Iterator[Rig]:
        rig = cls(tmp, settings)
        try:
            yield rig
        finally:
            rig.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """`kill -9` of the server: no shutdown; its guests live on."""
        kill_server(self.proc)

    def restart(self, **env: str) -> Server:
        """A new `rift serve` on the same data dir (a new port), `env` over the
        environment of the last one; stops the running one first, if any."""
        stop_server(self.proc)
        self.proc, self.server = restart_server(self.server, **env)
        return self.server

    def stop(self) -> None:
        stop_server(self.proc)

    def close(self) -> None:
        """Stop the server and check what it leaves: no domain of its own."""
        try:
            if self.settings.before_stop is not None and self.proc.poll() is None:
                self.settings.before_stop(self.server)
        finally:
            self.stop()
        if self.settings.check_left:
            remaining = our_domains(self.server)
            for domain in remaining.values():  # a failed test leaves no guest on the host
                remove_domain(domain.name)
            assert not remaining, f"domains left behind: {sorted(remaining)}"
        if self.settings.after_stop is not None:
            self.settings.after_stop(self.server)


@dataclass(frozen=True)
class Guest:
    """A running VM lent to a test, in a task of its own (the admin's)."""

    image: str
    handle: str
    task_id: str
    vm_id: str


class Guests:
    """The module's VM factory (see the module's docstring)."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.warm: dict[str, Guest] = {}
        self.made = 0  # how many VMs it booted (the rest were reused)

    @contextlib.contextmanager
    def lend(self, image: str = "tiny", **vm_args: Any) -> Iterator[Guest]:
        guest = self.warm.pop(image, None)
        if guest is None or not self._running(guest):
            if guest is not None:
                self._close(guest)
            guest = self._new(image, **vm_args)
        try:
            yield guest
        finally:
            if self._cleaned(guest):
                self.warm[image] = guest
            else:
                self._close(guest)

    def close(self) -> None:
        for guest in self.warm.values():
            self._close(guest)
        self.warm.clear()

    def _new(self, image: str, **vm_args: Any) -> Guest:
        srv = self.rig.server

        async def made() -> Guest:
            async with mcp_session(srv.url, srv.token, "rift-tests-guests") as s:
                opened = await call(s, "rift_task_new", name=f"a warm {image}")
                vm = (await call(s, "rift_vm_new", handle=opened["handle"], image=image,
                                 **vm_args))["vm"]
                assert vm["status"] == "running", vm
                return Guest(image, opened["handle"], opened["task"]["id"], vm["id"])

        self.made += 1
        return run(made, BOOT_LIMIT_S)

    def _running(self, guest: Guest) -> bool:
        srv = self.rig.server

        async def status() -> str:
            async with mcp_session(srv.url, srv.token, "rift-tests-guests") as s:
                return str((await call(s, "rift_vm_get", vm_id=guest.vm_id))["vm"]["status"])

        try:
            return run(status, 60) == "running"
        except Exception:  # a VM the harness cannot read is not lent again
            return False

    def _cleaned(self, guest: Guest) -> bool:
        """Kill the guest's running execs; whether it is still fit to lend."""
        srv = self.rig.server

        async def clean() -> bool:
            async with mcp_session(srv.url, srv.token, "rift-tests-guests") as s:
                vm = (await call(s, "rift_vm_get", vm_id=guest.vm_id))["vm"]
                if vm["status"] != "running":
                    return False
                for ex in (await call(s, "rift_vm_exec_list", handle=guest.handle))["execs"]:
                    if ex["status"] == "running":
                        await s.call_tool("rift_vm_exec_kill", {
                            "handle": guest.handle, "exec_id": ex["exec_id"],
                            "signal": "KILL"})
                return True

        try:
            return run(clean, 60)
        except Exception:  # e.g. the task was taken over: not lent again
            return False

    def _close(self, guest: Guest) -> None:
        srv = self.rig.server

        async def close() -> None:
            async with mcp_session(srv.url, srv.token, "rift-tests-guests") as s:
                await s.call_tool("rift_task_close", {"handle": guest.handle})

        with contextlib.suppress(Exception):  # a task taken over or closed already
            run(close, 120)


def module_tmp_name(module: str) -> str:
    """`tests.e2e.test_real_pause` -> `pause` (its server's temporary folder)."""
    return module.rsplit(".", 1)[-1].removeprefix("test_real_") or "real"
