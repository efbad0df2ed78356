"""The guest ports, split by who calls them (as nova keeps host.py and guest.py
apart): a running guest's files and ports (the file tools, exposures, the usage
sampler), its execs (the exec tools and the sweep), the per-task keys (starts,
teardown, images, the sweep), and its connection's life (boot waits, pools,
pauses, snapshots, forks, teardown). `Guests` bundles one of each.

Refusals come out as Rift errors (`guest_unreachable`, `invalid_argument`), an
exec the guest cannot serve as ExecGone, a port nothing listens on as PortClosed.
A control plane without real guests has the null objects of rift.services.absent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from rift.domain.model import Vm


@dataclass(frozen=True)
class GuestExec:
    """An exec as its guest's keeper tells it (rift-exec's view): `state` running,
    ended or lost (its keeper died without a word); output from `*_from` on."""

    state: Literal["running", "ended", "lost"]
    exit_code: int | None
    signal: int | None
    timed_out: bool
    killed: bool
    stdin_open: bool
    started_ms: int
    ended_ms: int | None
    stdout_total: int
    stderr_total: int
    stdout_from: int
    stderr_from: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True, kw_only=True)
class ExecStart:
    """Start `command` detached as exec `exec_id`, killed past `timeout_s`, its
    output kept up to `cap_bytes` a stream; its view at its end or after `wait_ms`,
    with at most `max_bytes` of each stream. Without `stdin` its stdin stays open
    (exec_input). With `pty` (rows, columns) it runs on a terminal of that size:
    its stdin is the terminal's input, its stdout all the terminal shows."""

    exec_id: str
    command: str
    stdin: bytes | None = None
    timeout_s: int
    cap_bytes: int
    wait_ms: int
    max_bytes: int
    pty: tuple[int, int] | None = None


@dataclass(frozen=True, kw_only=True)
class ExecRead:
    """Exec `exec_id`'s view with output from the offsets (at most `max_bytes` a
    stream), once there is some past them, it ended, or `wait_ms` passed; within
    `deadline_s` (default: the wait and the helper's slack)."""

    exec_id: str
    stdout_offset: int = 0
    stderr_offset: int = 0
    max_bytes: int
    wait_ms: int = 0
    deadline_s: float | None = None


# what a wake waits for (GuestLifecycle.resumed)
WokenBy = Literal["call", "exec", "exposure"]


class ExecGone(Exception):
    """The guest answered, but the exec cannot do what was asked: `why` is
    `unknown` (the guest has no such exec: it rebooted), `ended` or `stdin_closed`."""

    def __init__(self, why: Literal["unknown", "ended", "stdin_closed"]) -> None:
        super().__init__(why)
        self.why = why


class PortClosed(Exception):
    """The guest answered, but nothing in it accepted a connection to the port."""

    def __init__(self, port: int, reason: str) -> None:
        super().__init__(reason)
        self.port = port


class PortChannel(Protocol):
    """A byte stream to a TCP port in a guest (an SSH `direct-tcpip` channel). Its
    `fileno()` turns readable when data or the end arrives; after
    `setblocking(False)`, `recv` with nothing there raises TimeoutError (or
    BlockingIOError) and `send` may take less than it is given (`send_ready` says
    whether it takes any)."""

    def fileno(self) -> int: ...
    def recv(self, nbytes: int) -> bytes: ...
    def send(self, data: bytes) -> int: ...
    def send_ready(self) -> bool: ...
    def setblocking(self, blocking: bool) -> None: ...
    def shutdown_write(self) -> None: ...
    def close(self) -> None: ...


class GuestFiles(Protocol):
    """A running guest's files and TCP ports: the file tools, exposures, and the
    usage sampler (/proc/net/dev)."""

    def reachable(self, vm: Vm) -> None:
        """`guest_unreachable` at once when no call of this port can reach `vm`'s
        guest (this control plane has no guest access), before anything is recorded."""
        ...
    def open_port(self, vm: Vm, port: int, timeout_s: float) -> PortChannel: ...
    def write_file(self, vm: Vm, path: str, data: bytes, mode: int | None) -> int: ...
    def read_file(self, vm: Vm, path: str, *, limit: int | None = None,
                  timeout_s: float | None = None) -> tuple[bytes, bool]:
        """The file's first bytes (up to `limit`, else the file cap) and whether there
        were more, within `timeout_s` (else the file timeout)."""
        ...


class GuestExecs(Protocol):
    """A running guest's background execs (rift-exec): the exec tools and the sweep."""

    def reachable(self, vm: Vm) -> None:
        """`guest_unreachable` at once when no call of this port can reach `vm`'s
        guest (this control plane has no guest access), before anything is recorded."""
        ...
    def exec_start(self, vm: Vm, start: ExecStart) -> GuestExec: ...
    def exec_read(self, vm: Vm, read: ExecRead) -> GuestExec: ...
    def exec_input(self, vm: Vm, exec_id: str, data: bytes, *, eof: bool) -> int: ...
    def exec_kill(self, vm: Vm, exec_id: str, signal: Literal["TERM", "KILL"]) -> None: ...
    def exec_resize(self, vm: Vm, exec_id: str, rows: int, cols: int) -> None:
        """Give the terminal of a running exec started with `pty` a new size;
        ExecGone (`ended`) when it has none or it is gone."""
        ...


class GuestKeys(Protocol):
    """The per-task key pairs guests log in with, and the host keys pinned for them:
    starts (plans), images made from snapshots, teardown, pools and the sweep."""

    def task_key(self, task_id: str) -> str:
        """The OpenSSH public key line of the task's key pair (made on first use)."""
        ...
    def task_key_file(self, task_id: str) -> Path:
        """The file of the task's private key (made on first use): what
        `rift image add --snapshot` copies for the image's VMs to log in with."""
        ...
    def forget_task(self, task_id: str) -> None: ...
    def tidy_keys(self, needed: Callable[[str], bool]) -> int:
        """Delete the key of every task `needed(task_id)` says no to, and any key a
        crash left half made; answers how many went."""
        ...
    def host_key(self, vm_id: str) -> str | None:
        """The host key line pinned for the VM (seen at its boot), if any."""
        ...


class GuestLifecycle(Protocol):
    """A guest's connection through the VM's life: its boot, a pool's standby and
    hand-over, pauses, restores and forks, its end."""

    def wait_ready(self, vm: Vm, serial_log: Path, timeout_s: float,
                   markers: bool = True) -> None:
        """Return once the new guest answers SSH; `guest_unreachable` after the wait.
        With `markers` the guest's init prints a ready marker (and its host key) on
        the serial log first (`tiny`); without, only a successful login counts."""
        ...
    def standby(self, vm: Vm) -> None:
        """Ready the pooled guest `vm` for a quick hand-over (a shell waiting for it)."""
        ...
    def hand_over(self, vm: Vm, task_id: str, now: float) -> None:
        """Give a pooled guest to a task: `vm` as it was pooled (its `task_id` names
        the pool key it answers), whose root then accepts only the task's key; its
        clock is set to `now` (seconds since the epoch) and its entropy pool gets
        fresh bytes. The open connection stays and serves the task from then on."""
        ...
    def reconnect(self, vm: Vm, host_key: str | None, timeout_s: float) -> None:
        """After a restore: pin `host_key` and log in again (retrying until
        `timeout_s`), so the next call finds a connection open."""
        ...
    def drop_connections(self, vm_id: str) -> None:
        """Close the VM's connections before a pause cuts them; its host key stays
        pinned."""
        ...
    def resumed(self, vm: Vm, timeout_s: float, *, woken_by: WokenBy = "call") -> None:
        """After a resume or a wake: log in again (retrying until `timeout_s`) and set
        the guest's clock to this host's. `woken_by` is the call waiting for it:
        `call` (any), the clock set and the guest warmed up in one session, so an
        exec that follows costs what the next does; `exposure` (a request to an
        exposed port, which no exec helper serves), the login's connection carries
        the request, which has the guest to itself: the clock is set with the
        warm-up a moment after (the guest's server may see the clock it slept with
        for about a second and a half); `exec`, the clock set by the exec's
        own command, which warms the guest up as it runs (one session less before
        it)."""
        ...
    def forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
               boot_key: Path | None = None) -> str:
        """After a fork's restore: log in (its source's `host_key`, retrying until
        `timeout_s`) and give it an identity of its own (a new host key, the MAC
        `mac`, fresh entropy, the clock). Answers its new host key line.
        `boot_key` (a snapshot image's key file) is the key its guest accepts now:
        kept as the VM's boot key, the login takes it and hands the VM over to
        its own key."""
        ...
    def layer_forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
                     boot_key: Path | None = None) -> str:
        """`forked` for a build's VM of a layer (SPEC §19): the MAC, entropy and
        clock set the same, but its source's host key and SSH server stay (no
        restart to wait for before its state is saved). Answers `host_key`."""
        ...
    def close_vm(self, vm_id: str) -> None:
        """Close the VM's connections (calls in flight end) and forget its host key."""
        ...
    def close(self) -> None:
        """Close every connection (the control plane stops)."""
        ...


@dataclass(frozen=True)
class Guests:
    """The guest ports of one control plane (rift.bootstrap wires them)."""

    files: GuestFiles
    execs: GuestExecs
    keys: GuestKeys
    lifecycle: GuestLifecycle
