"""The engine's guest ports over `SshGuestShell`, one adapter per port: the
per-task keys live in `<data dir>/keys`, and guest errors become Rift refusals at
this boundary."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

from rift.domain.errors import GuestUnreachable, InvalidArgument
from rift.domain.model import Vm
from rift.guest.connections import ShellSettings
from rift.guest.errors import GuestError, GuestExecError, GuestFileError, GuestPortClosed
from rift.guest.keys import forget_task, keep_boot_key, key_for_task, tidy
from rift.guest.links import HostLinks
from rift.guest.routes import Routes
from rift.guest.shell import SshGuestShell
from rift.guest.warm import WARM_AFTER_S
from rift.services.ports import (
    ExecGone,
    ExecRead,
    ExecStart,
    GuestExec,
    Guests,
    PortChannel,
    PortClosed,
    WokenBy,
)

T = TypeVar("T")
log = logging.getLogger("rift")


def task_key(keys_dir: Path, task_id: str) -> str:
    return key_for_task(keys_dir, task_id)[1]


@contextmanager
def _refusals(vm_id: str) -> Iterator[None]:
    try:
        yield
    except GuestExecError as exc:
        raise ExecGone(exc.why) from exc  # type: ignore[arg-type]
    except GuestFileError as exc:
        raise InvalidArgument("path", str(exc)) from exc
    except GuestPortClosed as exc:
        raise PortClosed(exc.port, exc.message) from exc
    except GuestError as exc:
        raise GuestUnreachable(vm_id, str(exc)) from exc


def _call(vm: Vm, call: Callable[[], T]) -> T:
    with _refusals(vm.id):
        return call()


class SshFiles:
    """GuestFiles over the shell's files part."""

    def __init__(self, shell: SshGuestShell) -> None:
        self.files = shell.files

    def reachable(self, vm: Vm) -> None:
        return None  # each call says whether it reached the guest

    def open_port(self, vm: Vm, port: int, timeout_s: float) -> PortChannel:
        return _call(vm, lambda: self.files.open_port(vm, port, timeout_s))

    def write_file(self, vm: Vm, path: str, data: bytes, mode: int | None) -> int:
        return _call(vm, lambda: self.files.write_file(vm, path, data, mode))

    def read_file(self, vm: Vm, path: str, *, limit: int | None = None,
                  timeout_s: float | None = None) -> tuple[bytes, bool]:
        return _call(vm, lambda: self.files.read_file(vm, path, limit=limit,
                                                      timeout_s=timeout_s))


class SshExecs:
    """GuestExecs over the shell's execs part."""

    def __init__(self, shell: SshGuestShell) -> None:
        self.execs = shell.execs

    def reachable(self, vm: Vm) -> None:
        return None  # each call says whether it reached the guest

    def exec_start(self, vm: Vm, start: ExecStart) -> GuestExec:
        return _call(vm, lambda: self.execs.exec_start(vm, start))

    def exec_read(self, vm: Vm, read: ExecRead) -> GuestExec:
        return _call(vm, lambda: self.execs.exec_read(vm, read))

    def exec_input(self, vm: Vm, exec_id: str, data: bytes, *, eof: bool) -> int:
        return _call(vm, lambda: self.execs.exec_input(vm, exec_id, data, eof=eof))

    def exec_kill(self, vm: Vm, exec_id: str, signal: Literal["TERM", "KILL"]) -> None:
        _call(vm, lambda: self.execs.exec_kill(vm, exec_id, signal))

    def exec_resize(self, vm: Vm, exec_id: str, rows: int, cols: int) -> None:
        _call(vm, lambda: self.execs.exec_resize(vm, exec_id, rows, cols))


class TaskKeys:
    """GuestKeys: the key files in `keys_dir` (rift.guest.keys), and the host keys the
    shell pinned."""

    def __init__(self, keys_dir: Path, shell: SshGuestShell) -> None:
        self.keys_dir = keys_dir
        self.conns = shell.conns

    def task_key(self, task_id: str) -> str:
        return task_key(self.keys_dir, task_id)

    def task_key_file(self, task_id: str) -> Path:
        return key_for_task(self.keys_dir, task_id)[0]

    def forget_task(self, task_id: str) -> None:
        forget_task(self.keys_dir, task_id)

    def tidy_keys(self, needed: Callable[[str], bool]) -> int:
        return tidy(self.keys_dir, needed)

    def host_key(self, vm_id: str) -> str | None:
        return self.conns.host_key(vm_id)


class SshLifecycle:
    """GuestLifecycle over the shell's life part; `close` closes the shell and the
    links to hosts elsewhere."""

    def __init__(self, shell: SshGuestShell, links: HostLinks | None = None) -> None:
        self.shell = shell
        self.life = shell.life
        self.keys_dir = shell.keys_dir
        self.links = links

    def wait_ready(self, vm: Vm, serial_log: Path, timeout_s: float,
                   markers: bool = True) -> None:
        _call(vm, lambda: self.life.connect_when_ready(vm, serial_log, timeout_s,
                                                       markers=markers))

    def standby(self, vm: Vm) -> None:
        _call(vm, lambda: self.life.standby(vm))

    def hand_over(self, vm: Vm, task_id: str, now: float) -> None:
        _call(vm, lambda: self.life.hand_over(vm, task_key(self.keys_dir, task_id),
                                              task_id, now))

    def reconnect(self, vm: Vm, host_key: str | None, timeout_s: float) -> None:
        _call(vm, lambda: self.life.reconnect(vm, host_key, timeout_s))

    def drop_connections(self, vm_id: str) -> None:
        self.life.drop_connections(vm_id)

    def resumed(self, vm: Vm, timeout_s: float, *, woken_by: WokenBy = "call") -> None:
        def call() -> None:
            began = time.monotonic()
            # an exposure's request goes on the login's connection, its tunnel
            self.life.reconnect(vm, None, timeout_s, tunnel=woken_by == "exposure")
            logged_in = time.monotonic()
            warmed: bool | str
            if woken_by == "exec":  # its own command sets the clock and warms the guest up
                self.life.runner.clock_with_next_command(vm)
                warmed = "by the exec"
            elif woken_by == "exposure":  # the request alone first; the clock with the warm-up
                self.life.runner.clock_with_next_command(vm)
                self.life.runner.warmer.warm_later(vm, after_s=WARM_AFTER_S)
                warmed = "later"
            else:  # now, after the login took its time; warmed up in the same session
                warmed = self.life.set_clock_and_warm(vm, time.time())
            log.info("guest resumed", extra={
                "vm_id": vm.id, "login_ms": round((logged_in - began) * 1000, 1),
                "clock_and_warm_up_ms": round((time.monotonic() - logged_in) * 1000, 1),
                "warmed": warmed})

        _call(vm, call)

    def forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
               boot_key: Path | None = None) -> str:
        return self._fork(vm, host_key, timeout_s, boot_key,
                          lambda: self.life.refresh_identity(vm, mac))

    def layer_forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
                     boot_key: Path | None = None) -> str:
        def same_key() -> str:
            self.life.refresh_identity(vm, mac, keep_host_key=True)
            return host_key or ""

        return self._fork(vm, host_key, timeout_s, boot_key, same_key)

    def _fork(self, vm: Vm, host_key: str | None, timeout_s: float, boot_key: Path | None,
              identity: Callable[[], str]) -> str:
        def call() -> str:
            began = time.monotonic()
            if boot_key is not None:
                keep_boot_key(self.keys_dir, vm.id, vm.id, source=boot_key)
            self.life.reconnect(vm, host_key, timeout_s)
            logged_in = time.monotonic()
            line = identity()
            self.life.trust.ensure(vm)  # a fork of a guest from before the setting
            log.info("fork identity", extra={
                "vm_id": vm.id, "login_ms": round((logged_in - began) * 1000, 1),
                "refresh_ms": round((time.monotonic() - logged_in) * 1000, 1),
                "host_key_kept": line == (host_key or "")})
            self.life.runner.warmer.warm_later(vm)  # its first exec as fast as the next
            return line

        return _call(vm, call)

    def close_vm(self, vm_id: str) -> None:
        self.shell.close_vm(vm_id)

    def close(self) -> None:
        self.shell.close()
        if self.links is not None:
            self.links.close()


def ssh_guests(keys_dir: Path, settings: ShellSettings | None = None, *,
               routes: Routes | None = None,
               helper_binary: Callable[[], Path] | None = None) -> Guests:
    """The guest ports over one SSH guest shell whose keys are in `keys_dir`; its
    lifecycle port's `close` closes `routes`' links too."""
    shell = SshGuestShell(keys_dir, settings, routes=routes, helper_binary=helper_binary)
    return guests_of(shell, routes.links if routes is not None else None)


def guests_of(shell: SshGuestShell, links: HostLinks | None = None) -> Guests:
    """The guest ports over `shell`."""
    return Guests(files=SshFiles(shell), execs=SshExecs(shell),
                  keys=TaskKeys(shell.keys_dir, shell),
                  lifecycle=SshLifecycle(shell, links))
