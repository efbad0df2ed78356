"""The engine's ports. Each has a real adapter and a fake beside it, except the
store: it is SQL (SQLite or PostgreSQL), and the engine's tests run on a real
SQLite file.

The store is reached through a unit of work: ``with store.write() as tx:``
runs one transaction (state change and its event row commit together or not
at all); ``with store.read() as tx:`` reads a consistent snapshot. The rows are
reached through small repositories on it (rift/services/ports/repositories.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from hypervisor.base import DomainSpec, Hypervisor
from rift.domain.model import Vm
from rift.services.ports.repositories import (
    EventRepository,
    ExecRepository,
    ExposureRepository,
    HostRepository,
    MetaRepository,
    PoolRepository,
    SnapshotRepository,
    TaskRepository,
    TokenRepository,
    UserRepository,
    VmRepository,
    WebRepository,
)


class Tx(Protocol):
    """One transaction against the store (the unit of work), and the repositories
    it reaches the rows through: ``tx.tasks.get(task_id)``, ``tx.events.add(e)``."""

    @property
    def tasks(self) -> TaskRepository: ...
    @property
    def vms(self) -> VmRepository: ...
    @property
    def events(self) -> EventRepository: ...
    @property
    def users(self) -> UserRepository: ...
    @property
    def tokens(self) -> TokenRepository: ...
    @property
    def hosts(self) -> HostRepository: ...
    @property
    def meta(self) -> MetaRepository: ...
    @property
    def web(self) -> WebRepository: ...
    @property
    def pools(self) -> PoolRepository: ...
    @property
    def execs(self) -> ExecRepository: ...
    @property
    def snapshots(self) -> SnapshotRepository: ...
    @property
    def exposures(self) -> ExposureRepository: ...


class Store(Protocol):
    def read(self) -> AbstractContextManager[Tx]: ...
    def write(self) -> AbstractContextManager[Tx]: ...
    def close(self) -> None: ...


class HostPool(Protocol):
    """Opens (and caches) a hypervisor connection per host URI."""

    def hypervisor(self, uri: str) -> Hypervisor: ...
    def close(self) -> None: ...


class ImageCatalog(Protocol):
    """The guest images Rift knows; `tiny` is always among them."""

    def names(self) -> list[str]: ...
    def fixed_sizes(self, name: str) -> tuple[int, int, int] | None:
        """(vCPUs, memory MiB, disk GiB) that every VM of `name` has (an image made
        from a snapshot: its saved state has them), or None when VMs choose."""
        ...


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


class HostFiles(Protocol):
    """Puts a domain's files on its host before it starts there, when that host is
    elsewhere (rift.guest.links.RemoteFiles); HypervisorError(op="prepare") else."""

    def prepare(self, uri: str, spec: DomainSpec) -> None: ...
    def make_overlay(self, uri: str, base: str, overlay: str, size_bytes: int) -> None:
        """An empty qcow2 overlay of `base` on the host (a VM moving there)."""
        ...

    def forget(self, uri: str, vm_id: str) -> None:
        """Best effort: the VM's own files on its host (a host elsewhere) go."""
        ...


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


class GuestShell(Protocol):
    """Guests over SSH: commands, files, execs, the per-task key, waiting for a boot,
    streams to guest ports. Refusals come out as Rift errors (`guest_unreachable`,
    `invalid_argument`), an exec the guest cannot serve as ExecGone, a port nothing
    listens on as PortClosed."""

    def open_port(self, vm: Vm, port: int, timeout_s: float) -> PortChannel: ...

    def write_file(self, vm: Vm, path: str, data: bytes, mode: int | None) -> int: ...
    def read_file(self, vm: Vm, path: str, *, limit: int | None = None,
                  timeout_s: float | None = None) -> tuple[bytes, bool]:
        """The file's first bytes (up to `limit`, else the file cap) and whether there
        were more, within `timeout_s` (else the file timeout)."""
        ...
    def exec_start(self, vm: Vm, exec_id: str, command: str, stdin: bytes | None, *,
                   timeout_s: int, cap_bytes: int, wait_ms: int,
                   max_bytes: int) -> GuestExec:
        """Start `command` detached as exec `exec_id`; its view at its end or after
        `wait_ms`. Without `stdin` its stdin stays open (exec_input)."""
        ...
    def exec_read(self, vm: Vm, exec_id: str, stdout_offset: int, stderr_offset: int, *,
                  max_bytes: int, wait_ms: int, deadline_s: float | None = None) -> GuestExec:
        """The exec's view from the offsets, within `deadline_s` (default: the wait and
        the helper's slack)."""
        ...
    def exec_input(self, vm: Vm, exec_id: str, data: bytes, *, eof: bool) -> int: ...
    def exec_kill(self, vm: Vm, exec_id: str, signal: Literal["TERM", "KILL"]) -> None: ...
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
    def host_key(self, vm_id: str) -> str | None:
        """The host key line pinned for the VM (seen at its boot), if any."""
        ...
    def reconnect(self, vm: Vm, host_key: str | None, timeout_s: float) -> None:
        """After a restore: pin `host_key` and log in again (retrying until
        `timeout_s`), so the next call finds a connection open."""
        ...
    def drop_connections(self, vm_id: str) -> None:
        """Close the VM's connections before a pause cuts them; its host key stays
        pinned."""
        ...
    def resumed(self, vm: Vm, timeout_s: float) -> None:
        """After a resume: log in again (retrying until `timeout_s`) and set the
        guest's clock to this host's."""
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
    def close_vm(self, vm_id: str) -> None: ...
    def close(self) -> None: ...
