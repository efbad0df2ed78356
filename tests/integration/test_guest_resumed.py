"""The login after a wake, a resume or a snapshot (SshLifecycle.resumed) against a
real paramiko server on loopback, no QEMU: it logs in once, sets the guest's
clock and warms it up in one session (rift.guest.warm), and leaves that
connection open, so the call that woke the VM runs on it with no login of its
own."""

from __future__ import annotations

import logging
import shlex
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
from rift.guest import ShellSettings, SshGuestShell, key_for_task
from rift.guest.adapter import guests_of
from rift.guest.warm import WARM_UP_LINE, WARMED


@dataclass
class Guest(paramiko.ServerInterface):
    """A guest's SSH server that answers every command with exit 0 and keeps what
    it was asked to run, and how many logins it took."""

    commands: list[str] = field(default_factory=list)
    logins: int = 0

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return int(paramiko.common.OPEN_SUCCEEDED)

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.logins += 1
        return int(paramiko.common.AUTH_SUCCESSFUL)

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        # the login shell's line: a pid header, then `eval '<the command>'`
        line = shlex.split(command.decode().split("; eval ", 1)[1])[0]
        self.commands.append(line)
        out = f"{WARMED}\n".encode() if WARM_UP_LINE in line else b""  # its helper ran
        threading.Thread(target=self._answer, args=(channel, out), daemon=True).start()
        return True

    @staticmethod
    def _answer(chan: paramiko.Channel, out: bytes) -> None:
        time.sleep(0.01)  # after the server's reply to the exec request
        chan.sendall_stderr(b"rift-exec 1\n")
        chan.sendall(out)
        chan.send_exit_status(0)
        chan.close()


@pytest.fixture
def guest() -> Iterator[tuple[Guest, int]]:
    made, listener = Guest(), socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    transports: list[paramiko.Transport] = []
    host_key = paramiko.ECDSAKey.generate()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transports.append(transport)
            transport.start_server(server=made)

    threading.Thread(target=serve, daemon=True).start()
    yield made, listener.getsockname()[1]
    listener.close()
    for transport in transports:
        transport.close()


def test_a_wake_logs_in_once_sets_the_clock_and_warms_up_in_one_session_and_stays_open(
        guest: tuple[Guest, int], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake, port = guest
    caplog.set_level(logging.INFO, logger="rift")
    key_for_task(tmp_path, "task_resumed")
    shell = SshGuestShell(tmp_path, ShellSettings(connect_timeout_s=5.0))
    vm = Vm(id="vm_resumed01", task_id="task_resumed", owner="alice", name="r", image="tiny",
            status="running", host="local", vcpus=1, memory_mib=256,
            created_at=datetime.now(UTC), ssh_host="127.0.0.1", ssh_port=port)
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
