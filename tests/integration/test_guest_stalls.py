"""The guest adapter against SSH servers that misbehave as a hostile guest's may
(SPEC §15), on loopback, with no QEMU: a real paramiko server in this process
that never answers an exec request, never reads stdin, floods, or prints a
catastrophic view. Each call fails with GuestError within its deadline, the
thread that made it is free again, and another VM's calls on the same shell
answer meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import paramiko
import pytest

from rift.domain.model import Vm
from rift.guest import GuestError, ShellSettings, SshGuestShell, key_for_task
from rift.services.ports import ExecRead

READ_A = ExecRead(exec_id="exec_a", max_bytes=4096)
VIEW = (b"rift-exec state=ended code=0 signal=-1 timed_out=0 killed=0 stdin=closed "
        b"started=1 ended=2 out_total=2 err_total=0 out_from=0 out_len=2 err_from=0 "
        b"err_len=0\nok")


@dataclass
class Guest(paramiko.ServerInterface):
    """One fake guest's SSH server; `mode` says how its exec requests go."""

    mode: str
    released: threading.Event = field(default_factory=threading.Event)
    port: int = 0

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return int(paramiko.common.OPEN_SUCCEEDED)

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return int(paramiko.common.AUTH_SUCCESSFUL)

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        if self.mode == "silent":
            self.released.wait(30)  # the exec request is never answered
            return False
        threading.Thread(target=self._answer, args=(channel,), daemon=True).start()
        return True

    def _answer(self, chan: paramiko.Channel) -> None:
        time.sleep(0.02)  # after the server's reply to the exec request (sent on return)
        try:
            if self.mode == "deaf":  # never reads its stdin, never ends
                self.released.wait(30)
            elif self.mode == "flood":
                while not self.released.is_set():
                    chan.sendall(b"y" * 65536)
            else:
                chan.sendall(b"rift-exec " + b"a=" * 60 if self.mode == "catastrophic"
                             else VIEW)
                chan.send_exit_status(0)
                chan.close()
        except (OSError, EOFError, paramiko.SSHException):
            return


def _serve(guest: Guest, listener: socket.socket, host_key: paramiko.PKey,
           transports: list[paramiko.Transport]) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        transport = paramiko.Transport(conn)
        transport.add_server_key(host_key)
        transports.append(transport)
        transport.start_server(server=guest)


@pytest.fixture
def guests() -> Iterator[dict[str, Guest]]:
    key = paramiko.RSAKey.generate(2048)
    made: dict[str, Guest] = {}
    listeners: list[socket.socket] = []
    transports: list[paramiko.Transport] = []
    for mode in ("silent", "deaf", "flood", "catastrophic", "fine"):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        guest = Guest(mode, port=listener.getsockname()[1])
        threading.Thread(target=_serve, args=(guest, listener, key, transports),
                         daemon=True).start()
        made[mode] = guest
        listeners.append(listener)
    yield made
    for guest in made.values():
        guest.released.set()
    for listener in listeners:
        listener.close()
    for transport in transports:
        transport.close()


def _vm(name: str, port: int) -> Vm:
    return Vm(id=f"vm_{name}", task_id="task_stalls", owner="alice", name=name, image="tiny",
              status="running", host="local", vcpus=1, memory_mib=256,
              created_at=datetime.now(UTC), ssh_host="127.0.0.1", ssh_port=port)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[SshGuestShell]:
    key_for_task(tmp_path, "task_stalls")
    made = SshGuestShell(tmp_path, ShellSettings(file_timeout_s=1.0, connect_timeout_s=5.0))
    yield made
    made.close()


def _fails_within(seconds: float, call: object, match: str | None = None) -> float:
    began = time.monotonic()
    with pytest.raises(GuestError, match=match):
        call()  # type: ignore[operator]
    took = time.monotonic() - began
    assert took < seconds, took
    return took


def test_an_exec_request_never_answered_ends_at_the_deadline(
        guests: dict[str, Guest], shell: SshGuestShell) -> None:
    vm = _vm("silent", guests["silent"].port)
    took = _fails_within(4.0, lambda: shell.execs.exec_input(vm, "exec_a", b"x", eof=True),
                         "within")
    assert took >= 1.0  # the deadline (1 s) and the watchdog's grace, not at once


def test_input_a_guest_never_reads_ends_at_the_deadline(
        guests: dict[str, Guest], shell: SshGuestShell) -> None:
    vm = _vm("deaf", guests["deaf"].port)
    _fails_within(4.0, lambda: shell.execs.exec_input(vm, "exec_a", b"x" * (8 << 20), eof=True))


def test_a_flood_is_cut_at_the_answers_size(
        guests: dict[str, Guest], shell: SshGuestShell) -> None:
    vm = _vm("flood", guests["flood"].port)
    _fails_within(2.0, lambda: shell.execs.exec_kill(vm, "exec_a", "TERM"), "more than")
    _fails_within(5.0, lambda: shell.execs.exec_read(vm, READ_A),
                  "more than")


def test_a_catastrophic_view_is_refused_at_once(
        guests: dict[str, Guest], shell: SshGuestShell) -> None:
    vm = _vm("catastrophic", guests["catastrophic"].port)
    _fails_within(2.0, lambda: shell.execs.exec_read(vm, READ_A),
                  "no view")


def test_stalled_guests_make_no_other_vm_wait(
        guests: dict[str, Guest], shell: SshGuestShell) -> None:
    outcomes: list[BaseException | None] = []

    def stalled_call(mode: str) -> None:
        try:
            shell.execs.exec_input(_vm(mode, guests[mode].port), "exec_a", b"x" * (8 << 20),
                             eof=True)
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)

    stalled = [threading.Thread(target=stalled_call, args=(mode,))
               for mode in ("silent", "deaf") for _ in range(3)]
    for thread in stalled:
        thread.start()
    fine = _vm("fine", guests["fine"].port)
    answered: list[float] = []
    while any(thread.is_alive() for thread in stalled):
        began = time.monotonic()
        seen = shell.execs.exec_read(fine, READ_A)
        assert seen.stdout == b"ok"
        answered.append(time.monotonic() - began)
    for thread in stalled:
        thread.join(10)
        assert not thread.is_alive()  # each stalled call's thread is free again
    assert len(outcomes) == 6 and all(isinstance(o, GuestError) for o in outcomes), outcomes
    assert len(answered) >= 5 and max(answered) < 0.5, answered


def test_a_guest_that_accepts_and_never_speaks_ssh_fails_at_the_connect_timeout(
        tmp_path: Path) -> None:
    key_for_task(tmp_path, "task_stalls")
    quiet = SshGuestShell(tmp_path, ShellSettings(connect_timeout_s=1.0, file_timeout_s=30.0))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel accepts; nothing ever answers
        vm = _vm("mute", listener.getsockname()[1])
        try:
            _fails_within(4.0, lambda: quiet.execs.exec_input(vm, "exec_a", b"x", eof=True))
        finally:
            quiet.close()
