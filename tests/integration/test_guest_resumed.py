"""The login after a wake, a resume or a snapshot (SshLifecycle.resumed) against a
real paramiko server on loopback, no QEMU: it logs in once, sets the guest's
clock and warms it up in one session (rift.guest.warm), and leaves that
connection open, so the call that woke the VM runs on it with no login of its
own; a wake by an exec leaves the clock to the exec's own command, a wake by a
request to an exposure leaves the guest to that request and sets the clock with
the warm-up a moment after."""

from __future__ import annotations

import logging
import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest

from rift.guest import ShellSettings, SshGuestShell, key_for_task
from rift.guest import runner as guest_runner
from rift.guest.adapter import guests_of
from rift.guest.errors import GuestError
from rift.guest.warm import WARM_AFTER_S, WARM_UP_LINE, WARMED
from tests.support.ssh_servers import LoopbackGuest, serving, vm_at


@dataclass(eq=False)
class Guest(LoopbackGuest):
    """A guest's SSH server that answers every command with exit 0 and keeps what
    it was asked to run."""

    commands: list[str] = field(default_factory=list)
    forwarded: list[int] = field(default_factory=list)  # ports of direct-tcpip channels

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        self.forwarded.append(destination[1])
        return int(paramiko.common.OPEN_SUCCEEDED)

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        # the login shell's line: a pid header, then `eval '<the command>'`
        line = shlex.split(command.decode().split("; eval ", 1)[1])[0]
        if "refused" in line:
            return False  # the command never runs
        self.commands.append(line)
        out = f"{WARMED}\n".encode() if WARM_UP_LINE in line else b""  # its helper ran
        threading.Thread(target=self._answer, args=(channel, out), daemon=True).start()
        return True

    def _answer(self, chan: paramiko.Channel, out: bytes) -> None:
        time.sleep(0.01)  # after the server's reply to the exec request
        try:
            chan.sendall_stderr(b"rift-exec 1\n")
            chan.sendall(out)
            chan.send_exit_status(0)
        except (OSError, EOFError, paramiko.SSHException):  # the client hung up first: go on
            pass
        chan.close()


@pytest.fixture
def guest() -> Iterator[tuple[Guest, int]]:
    made = Guest()
    with serving(made) as port:
        yield made, port


def test_a_wake_logs_in_once_sets_the_clock_and_warms_up_in_one_session_and_stays_open(
        guest: tuple[Guest, int], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake, port = guest
    caplog.set_level(logging.INFO, logger="rift")
    key_for_task(tmp_path, "task_resumed")
    shell = SshGuestShell(tmp_path, ShellSettings(connect_timeout_s=5.0))
    vm = vm_at(port, "resumed01", "task_resumed")
    try:
        before = time.time()
        guests_of(shell).lifecycle.resumed(vm, 10.0)
        after = time.time()
        assert fake.logins == 1 and len(fake.commands) == 1, fake
        clock, warm_up = fake.commands[0].split(" && ", 1)
        assert clock.startswith('date -s "@') and clock.endswith('" >/dev/null'), clock
        assert round(before) <= int(clock.split("@")[1].split('"')[0]) <= round(after)
        assert warm_up == f"{{ {WARM_UP_LINE}; }}"
        resumed = [r for r in caplog.records if r.getMessage() == "guest resumed"]
        assert [getattr(r, "warmed", None) for r in resumed] == [True], caplog.records
        # the call that woke the VM: on the connection the wake left open
        ran = shell.life.runner.run(vm, "echo the first call", None, 5.0, 4096)
        assert ran.exit_code == 0
        assert fake.commands[1:] == ["echo the first call"] and fake.logins == 1, fake
    finally:
        shell.close()


def test_a_wake_by_an_exposure_lends_its_login_to_the_request_and_sets_the_clock_after(
        guest: tuple[Guest, int], tmp_path: Path) -> None:
    """A request to an exposure needs no exec helper: the wake's login becomes the
    VM's tunnel, which carries the request's channel, and nothing else runs in the
    guest beside it (a session there, on a login of its own, took a just-restored
    `debian`'s one vCPU from the request); WARM_AFTER_S later, one session on another
    connection sets the clock and warms the guest up."""
    fake, port = guest
    key_for_task(tmp_path, "task_resumed")
    shell = SshGuestShell(tmp_path, ShellSettings(connect_timeout_s=5.0))
    vm = vm_at(port, "resumed02", "task_resumed")
    try:
        before, began = time.monotonic(), time.time()
        guests_of(shell).lifecycle.resumed(vm, 10.0, woken_by="exposure")
        tunnel = shell.conns.tunnels[vm.id]
        chan = shell.files.open_port(vm, 8080, 5.0)
        assert chan.get_transport() is tunnel and fake.forwarded == [8080], fake
        chan.close()
        assert fake.commands == [] and fake.logins == 1, fake  # the request alone
        while not fake.commands:
            assert time.monotonic() - before < WARM_AFTER_S + 5, "the clock was never set"
            time.sleep(0.01)
        assert time.monotonic() - before >= WARM_AFTER_S * 0.9
        shell.life.runner.warmer.settle(vm.id)  # its answer read before the shell closes
        _clock_then(fake.commands[0], WARM_UP_LINE, began, time.time())
        assert fake.logins == 2 and len(fake.commands) == 1, fake  # one session, both
        assert not shell.conns.take_clock(vm.id)  # not owed any more: no other session
    finally:
        shell.close()


def _clock_then(line: str, command: str, before: float, after: float) -> None:
    clock, rest = line.split("; ", 1)
    assert clock.startswith('date -s "@') and clock.endswith('" >/dev/null 2>&1'), line
    assert round(before) <= int(clock.split("@")[1].split('"')[0]) <= round(after) + 1
    assert rest == command, line


def test_a_wake_by_an_exec_leaves_the_clock_to_its_command_and_owes_it_until_one_runs(
        guest: tuple[Guest, int], tmp_path: Path) -> None:
    """No session of its own: the login alone, then the exec's command sets the clock
    first (a refused command owes it still; the command after it does not)."""
    fake, port = guest
    key_for_task(tmp_path, "task_resumed")
    shell = SshGuestShell(tmp_path, ShellSettings(connect_timeout_s=5.0))
    vm = vm_at(port, "resumed03", "task_resumed")
    runner = shell.life.runner
    try:
        guests_of(shell).lifecycle.resumed(vm, 10.0, woken_by="exec")
        assert fake.logins == 1 and fake.commands == [], fake
        with pytest.raises(GuestError):
            runner.run(vm, "echo refused", None, 5.0, 4096)
        before = time.time()
        assert runner.run(vm, "echo the exec", None, 5.0, 4096).exit_code == 0
        _clock_then(fake.commands[0], "echo the exec", before, time.time())
        assert runner.run(vm, "echo the next", None, 5.0, 4096).exit_code == 0
        assert fake.commands[1:] == ["echo the next"], fake.commands
    finally:
        shell.close()


def test_an_owed_clock_is_set_on_its_own_when_no_command_comes(
        guest: tuple[Guest, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, port = guest
    monkeypatch.setattr(guest_runner, "CLOCK_OWED_S", 0.2)
    key_for_task(tmp_path, "task_resumed")
    shell = SshGuestShell(tmp_path, ShellSettings(connect_timeout_s=5.0))
    vm = vm_at(port, "resumed04", "task_resumed")
    try:
        before = time.time()
        guests_of(shell).lifecycle.resumed(vm, 10.0, woken_by="exec")
        woke = time.monotonic()
        while not fake.commands:
            assert time.monotonic() - woke < 5, "the owed clock was never set"
            time.sleep(0.05)
        _clock_then(fake.commands[0], "true", before, time.time())
        assert fake.logins == 1, fake
    finally:
        shell.close()
