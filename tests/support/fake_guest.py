"""Fake guest ports for the engine's unit tests (no VM, no SSH), one beside each
real adapter of rift.guest.adapter: `FakeFiles` (files in a dict, guest ports
played by the test's servers), `FakeExecs` (execs whose guest side the test
plays), `FakeKeys` and `FakeLifecycle` (nothing to do, calls noted);
`fake_guests` bundles them.

`echo TEXT` and `cat` end at once (cat echoes its stdin); any other command runs
until the test ends it (`finish`), feeds it output (`write`) or the guest forgets
it (`forget`, a reboot)."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rift.domain.model import Vm
from rift.services.ports import (
    ExecGone,
    ExecRead,
    ExecStart,
    GuestExec,
    Guests,
    PortClosed,
    WokenBy,
)

_ECHO = re.compile(r"echo (.*)")


@dataclass
class FakeExec:
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    state: Literal["running", "ended", "lost"] = "running"
    exit_code: int | None = None
    signal: int | None = None
    killed: bool = False
    timed_out: bool = False
    stdin_open: bool = True
    stdin: bytearray = field(default_factory=bytearray)
    pty: tuple[int, int] | None = None  # its terminal's rows and columns, if it has one


@dataclass
class FakeFiles:
    """GuestFiles: files in a dict; a guest port is a server of the test's."""

    files: dict[str, bytes] = field(default_factory=dict)
    # guest port -> the address of the test's server that plays it (open_port)
    ports: dict[int, tuple[str, int]] = field(default_factory=dict)
    opened: list[tuple[str, int]] = field(default_factory=list)

    def reachable(self, vm: Vm) -> None:
        return None

    def open_port(self, vm: Vm, port: int, timeout_s: float) -> SocketChannel:
        """A guest port is a server of the test's on this machine (`ports`)."""
        self.opened.append((vm.id, port))
        address = self.ports.get(port)
        if address is None:
            raise PortClosed(port, "connection refused")
        try:
            return SocketChannel(socket.create_connection(address, timeout=timeout_s))
        except OSError as exc:
            raise PortClosed(port, str(exc)) from exc

    def write_file(self, vm: Vm, path: str, data: bytes, mode: int | None) -> int:
        self.files[path] = data
        return len(data)

    def read_file(self, vm: Vm, path: str, *, limit: int | None = None,
                  timeout_s: float | None = None) -> tuple[bytes, bool]:
        data = self.files[path]
        return (data, False) if limit is None else (data[:limit], len(data) > limit)


@dataclass
class FakeKeys:
    """GuestKeys: no key files; what was forgotten is noted."""

    forgotten: list[str] = field(default_factory=list)

    def task_key(self, task_id: str) -> str:
        return f"ssh-ed25519 AAAAfake{task_id} rift"

    def task_key_file(self, task_id: str) -> Path:
        return Path("/nonexistent/keys") / task_id

    def forget_task(self, task_id: str) -> None:
        self.forgotten.append(task_id)

    def tidy_keys(self, needed: Callable[[str], bool]) -> int:
        return 0

    def host_key(self, vm_id: str) -> str | None:
        return None


@dataclass
class FakeLifecycle:
    """GuestLifecycle: nothing is connected; the calls are noted (name, VM id)."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    woken_by: list[tuple[str, str]] = field(default_factory=list)  # (VM id, woken_by)

    def wait_ready(self, vm: Vm, serial_log: Path, timeout_s: float,
                   markers: bool = True) -> None:
        self.calls.append(("wait_ready", vm.id))

    def standby(self, vm: Vm) -> None:
        self.calls.append(("standby", vm.id))

    def hand_over(self, vm: Vm, task_id: str, now: float) -> None:
        self.calls.append(("hand_over", vm.id))

    def reconnect(self, vm: Vm, host_key: str | None, timeout_s: float) -> None:
        self.calls.append(("reconnect", vm.id))

    def drop_connections(self, vm_id: str) -> None:
        self.calls.append(("drop_connections", vm_id))  # a pause: nothing here is connected

    def resumed(self, vm: Vm, timeout_s: float, *, woken_by: WokenBy = "call") -> None:
        self.calls.append(("resumed", vm.id))
        self.woken_by.append((vm.id, woken_by))

    def forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
               boot_key: Path | None = None) -> str:
        self.calls.append(("forked", vm.id))
        return host_key or ""

    def layer_forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
                     boot_key: Path | None = None) -> str:
        self.calls.append(("layer_forked", vm.id))
        return host_key or ""

    def close_vm(self, vm_id: str) -> None:
        self.calls.append(("close_vm", vm_id))

    def close(self) -> None:
        return None


def fake_guests(files: FakeFiles | None = None, execs: FakeExecs | None = None, *,
                keys: FakeKeys | None = None,
                lifecycle: FakeLifecycle | None = None) -> Guests:
    """The guest ports of a unit test: the fakes given, new ones for the rest."""
    return Guests(files=files or FakeFiles(), execs=execs or FakeExecs(),
                  keys=keys or FakeKeys(), lifecycle=lifecycle or FakeLifecycle())


@dataclass
class FakeExecs:
    """GuestExecs: execs whose guest side the test plays."""

    execs: dict[str, FakeExec] = field(default_factory=dict)
    cap: int = 1 << 20  # the ring: the newest bytes of each stream kept
    waits: list[int] = field(default_factory=list)  # the wait_ms of every start and read
    # The guest's side while Rift waits (exec id, wait_ms): what happens meanwhile.
    on_wait: Callable[[str, int], None] | None = None

    def reachable(self, vm: Vm) -> None:
        return None

    # execs, the test's side

    def write(self, exec_id: str, stdout: bytes = b"", stderr: bytes = b"") -> None:
        self.execs[exec_id].stdout += stdout
        self.execs[exec_id].stderr += stderr

    def finish(self, exec_id: str, exit_code: int | None = 0, signal: int | None = None,
               *, timed_out: bool = False) -> None:
        ex = self.execs[exec_id]
        ex.state, ex.exit_code, ex.signal, ex.timed_out = "ended", exit_code, signal, timed_out
        ex.stdin_open = False

    def forget(self, exec_id: str) -> None:
        del self.execs[exec_id]

    # execs, Rift's side (the GuestExecs port)

    def exec_start(self, vm: Vm, start: ExecStart) -> GuestExec:
        exec_id, command, stdin, wait_ms = start.exec_id, start.command, start.stdin, start.wait_ms
        self.waits.append(wait_ms)
        ex = self.execs[exec_id] = FakeExec(pty=start.pty)
        echo = _ECHO.fullmatch(command)
        if echo:
            ex.stdout += echo.group(1).encode() + b"\n"
            self.finish(exec_id)
        elif command == "cat" and stdin is not None:
            ex.stdout += stdin
            self.finish(exec_id)
        elif stdin is not None:
            ex.stdin += stdin
            ex.stdin_open = False
        self._meanwhile(exec_id, wait_ms)
        return self._view(exec_id, 0, 0, start.max_bytes)

    def exec_read(self, vm: Vm, read: ExecRead) -> GuestExec:
        self.waits.append(read.wait_ms)
        if read.exec_id not in self.execs:
            raise ExecGone("unknown")
        self._meanwhile(read.exec_id, read.wait_ms)
        return self._view(read.exec_id, read.stdout_offset, read.stderr_offset, read.max_bytes)

    def _meanwhile(self, exec_id: str, wait_ms: int) -> None:
        if wait_ms > 0 and self.on_wait is not None and self.execs[exec_id].state == "running":
            self.on_wait(exec_id, wait_ms)

    def exec_input(self, vm: Vm, exec_id: str, data: bytes, *, eof: bool) -> int:
        ex = self.execs.get(exec_id)
        if ex is None or ex.state != "running":
            raise ExecGone("ended" if ex else "unknown")
        if not ex.stdin_open:
            raise ExecGone("stdin_closed")
        ex.stdin += data
        ex.stdin_open = not eof
        return len(data)

    def exec_kill(self, vm: Vm, exec_id: str, signal: Literal["TERM", "KILL"]) -> None:
        ex = self.execs.get(exec_id)
        if ex is None:
            raise ExecGone("unknown")
        if ex.state == "running":
            ex.killed = True
            self.finish(exec_id, None, 15 if signal == "TERM" else 9)

    def exec_resize(self, vm: Vm, exec_id: str, rows: int, cols: int) -> None:
        ex = self.execs.get(exec_id)
        if ex is None or ex.state != "running" or ex.pty is None:
            raise ExecGone("ended")
        ex.pty = (rows, cols)

    def _view(self, exec_id: str, out_off: int, err_off: int, max_bytes: int) -> GuestExec:
        ex = self.execs[exec_id]
        (out, out_from), (err, err_from) = (_ring(ex.stdout, out_off, max_bytes, self.cap),
                                            _ring(ex.stderr, err_off, max_bytes, self.cap))
        return GuestExec(state=ex.state, exit_code=ex.exit_code, signal=ex.signal,
                         timed_out=ex.timed_out, killed=ex.killed, stdin_open=ex.stdin_open,
                         started_ms=1_000, ended_ms=1_250 if ex.state == "ended" else None,
                         stdout_total=len(ex.stdout), stderr_total=len(ex.stderr),
                         stdout_from=out_from, stderr_from=err_from, stdout=out, stderr=err)


def _ring(stream: bytearray, offset: int, max_bytes: int, cap: int) -> tuple[bytes, int]:
    total = len(stream)
    start = min(max(offset, total - cap, 0), total)
    return bytes(stream[start:start + max_bytes]), start


class SocketChannel:
    """A TCP connection to a test's server, as the PortChannel an SSH channel is."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self, nbytes: int) -> bytes:
        return self.sock.recv(nbytes)

    def send(self, data: bytes) -> int:
        return self.sock.send(data)

    def send_ready(self) -> bool:
        return True

    def setblocking(self, blocking: bool) -> None:
        self.sock.setblocking(blocking)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()
