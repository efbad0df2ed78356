"""The guest shell: commands and files in a VM's guest over SSH (paramiko).

SSH connections are opened on first use and reused by later calls (see
rift.guest.pool: one channel at a time per connection, a few connections per
VM for concurrent calls, dead ones replaced); `close_vm` closes them when the
VM goes. Logins use the task's key (rift.guest.keys). Each call runs on its
own channel, whose exit status is read and which is closed before the
connection serves another call (dropbear fails later channels otherwise).

Files move through `cat` (dropbear has no SFTP server), so any guest with a
POSIX shell serves; they are binary-safe. Every paramiko or socket failure
becomes GuestError; a failed file operation in a guest that answered is
GuestFileError.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import paramiko

from hypervisor.base import ImageError
from hypervisor.exec_helper import GUEST_PATH
from rift.domain.egress import proxied, proxy_environment
from rift.domain.model import Vm
from rift.guest.console import TAIL_BYTES, ConsoleKeeper
from rift.guest.errors import GuestError, GuestExecError, GuestFileError, GuestPortClosed
from rift.guest.exec_view import (
    EXEC_ENDED,
    NO_SUCH_EXEC,
    STDIN_CLOSED,
    ViewError,
    input_command,
    kill_command,
    parse_view,
    read_command,
    start_command,
    view_size,
)
from rift.guest.keys import keep_boot_key, key_path, load_key, new_host_key, public_line
from rift.guest.links import HostLinkError, HostLinks, SshTarget, ssh_target
from rift.guest.pool import ConnectionPool
from rift.guest.ready import Console, read_markers, same_key, serial_tail, wait_for_marker
from rift.guest.run import Collected, collect, command_line, feed_stdin, kill_line, send_within
from rift.guest.watchdog import Guard, Watchdog
from rift.services.ports import GuestExec

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_FAILURES = (paramiko.SSHException, OSError, EOFError, ConnectionError)
_KILL_WAIT_S = 5.0
_LOGIN_RETRY_S = 0.5  # between SSH logins to a guest that prints no ready marker
_HAND_OVER_S = 10.0  # a hand-over is a few shell builtins: its guest is gone past this
_NOT_FOUND = 127  # the shell's exit status for a command it cannot find
_SETTLE_S = 2.5  # how long a fork's SSH server waits before it starts anew (identity)
_RESTART_S = _SETTLE_S + 5.0  # how long it may take to listen again, from then
_HELPER_SLACK_S = 15.0  # beyond a helper call's own wait: its channel and process
_GRACE_S = 1.0  # past a call's deadline, the watchdog closes a connection stuck in paramiko
_SMALL_ANSWER = 4096  # the most a helper's `input` or `kill` prints
_IS_DIRECTORY = 21
_NO_SUCH_FILE = 20
_REASON_MAX = 500  # characters of a guest's stderr kept as a failed file operation's reason


@dataclass(frozen=True)
class ExecResult:
    """A command run to its end on one channel (`SshGuestShell.exec`)."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration_ms: int


class SshGuestShell:
    """GuestShell over SSH, for guests whose root accepts the task's key."""

    def __init__(
        self,
        keys_dir: Path,
        *,
        user: str = "root",
        connect_timeout_s: float = 10.0,
        output_cap: int = 1 * MIB,
        file_cap: int = 16 * MIB,
        file_timeout_s: float = 300.0,
        window_bytes: int = 4 * MIB,
        connections_per_vm: int = 4,
        serial_dir: Path | None = None,
        egress_proxy_port: int | None = None,
        helper_binary: Callable[[], Path] | None = None,
        links: HostLinks | None = None,
        host_uri: Callable[[str], str | None] | None = None,
        console_cap_bytes: int | None = None,
    ) -> None:
        self.keys_dir = keys_dir
        # Guests of hosts elsewhere are reached through their host's SSH (`links`);
        # `host_uri` says which URI a host name has (None: a host of this machine).
        self.links = links
        self.host_uri = host_uri
        # Commands of guests with an egress allowlist name the egress proxy (SPEC §13),
        # which QEMU's user network shows them at 10.0.2.2 (the host's loopback).
        self.egress_environment = (
            proxy_environment(f"http://10.0.2.2:{egress_proxy_port}")
            if egress_proxy_port else "")
        # rift-exec for guests without it (hypervisor.exec_helper; compiled on first use)
        self.helper_binary = helper_binary
        self.serial_dir = serial_dir  # where `<vm id>.log` holds each guest's console
        # keeps those logs under the cap, here and on hosts elsewhere (from the first boot)
        self._keeper = (ConsoleKeeper(serial_dir, console_cap_bytes, remote=self._on_hosts)
                        if serial_dir is not None and console_cap_bytes else None)
        self.user = user
        self.connect_timeout_s = connect_timeout_s
        self.output_cap = output_cap
        self.file_cap = file_cap
        self.file_timeout_s = file_timeout_s
        self.window_bytes = window_bytes
        self._lock = threading.Lock()
        self._host_keys: dict[str, str] = {}  # vm id -> pinned host key line
        self._task_of: dict[str, str] = {}  # vm id -> task id, for the login key
        self._host_of: dict[str, str] = {}  # vm id -> the name of its host
        # vm id -> (connection, shell) of a pooled VM waiting for its hand-over
        self._standby: dict[str, tuple[paramiko.Transport, paramiko.Channel]] = {}
        # VMs put away (close_vm) since their boot wait began: the wait ends at once
        self._closed: set[str] = set()
        # VM id -> until when its SSH server may still be restarting (a fork's)
        self._restarting: dict[str, float] = {}
        self._serial: dict[str, Path] = {}  # vm id -> serial log given by its boot wait
        # vm id -> the connection that carries its exposures' channels (many at once)
        self._tunnels: dict[str, paramiko.Transport] = {}
        self._pool: ConnectionPool[paramiko.Transport] = ConnectionPool(
            self._connect, per_vm=connections_per_vm)
        # closes a connection whose call is stuck past its deadline (rift.guest.watchdog)
        self._watchdog = Watchdog()

    # GuestShell

    def exec(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: int) -> ExecResult:
        started = time.monotonic()
        collected = self._run(vm, self._environment(vm) + command, stdin, float(timeout_s),
                              self.output_cap)
        return ExecResult(
            exit_code=collected.exit_code,
            stdout=collected.stdout,
            stderr=collected.stderr,
            timed_out=collected.timed_out,
            truncated=collected.truncated,
            duration_ms=round((time.monotonic() - started) * 1000),
        )

    def _environment(self, vm: Vm) -> str:
        """What a command of `vm`'s is prefixed with: the egress proxy's address when
        its egress is an allowlist."""
        return self.egress_environment if proxied(vm.egress) else ""

    def write_file(self, vm: Vm, path: str, data: bytes, mode: int | None) -> int:
        _absolute(path, vm)
        quoted = shlex.quote(path)
        script = (f"p={quoted}; if [ -d \"$p\" ]; then echo 'is a directory' >&2; "
                  f"exit {_IS_DIRECTORY}; fi; cat > \"$p\" || exit 1")
        if mode is not None:
            script += f"; chmod {mode & 0o7777:o} \"$p\""
        self._file_op(vm, path, script, data)
        return len(data)

    def read_file(self, vm: Vm, path: str, *, limit: int | None = None,
                  timeout_s: float | None = None) -> tuple[bytes, bool]:
        _absolute(path, vm)
        cap = self.file_cap if limit is None else min(limit, self.file_cap)
        quoted = shlex.quote(path)
        script = (f"p={quoted}; if [ -d \"$p\" ]; then echo 'is a directory' >&2; "
                  f"exit {_IS_DIRECTORY}; fi; if [ ! -e \"$p\" ]; then "
                  f"echo 'no such file' >&2; exit {_NO_SUCH_FILE}; fi; "
                  f"exec head -c {cap + 1} \"$p\"")
        data = self._file_op(vm, path, script, None, cap=cap, timeout_s=timeout_s)
        return data[:cap], len(data) > cap

    # background execs (rift-exec in the guest: hypervisor/rift_exec.c)

    def exec_start(self, vm: Vm, exec_id: str, command: str, stdin: bytes | None, *,
                   timeout_s: int, cap_bytes: int, wait_ms: int, max_bytes: int) -> GuestExec:
        """Start `command` detached in the guest as exec `exec_id` and answer its view
        once it ended or `wait_ms` passed (it runs on after). `stdin`, when given,
        is its whole stdin; else its stdin stays open for `exec_input`."""
        line = start_command(exec_id, self._environment(vm) + command, timeout_s=timeout_s,
                             cap_bytes=cap_bytes, wait_ms=wait_ms, max_bytes=max_bytes,
                             with_stdin=stdin is not None)
        status, data = self._helper(vm, line, stdin, wait_ms / 1000 + _HELPER_SLACK_S,
                                    view=True, limit=view_size(max_bytes))
        return self._view(vm, exec_id, status, data, max_bytes)

    def exec_read(self, vm: Vm, exec_id: str, stdout_offset: int, stderr_offset: int, *,
                  max_bytes: int, wait_ms: int, deadline_s: float | None = None) -> GuestExec:
        """The exec's view with output from the offsets, once there is some past
        them, it ended, or `wait_ms` passed; GuestError past `deadline_s` (default:
        the wait and the helper's slack)."""
        line = read_command(exec_id, stdout_offset, stderr_offset, max_bytes, wait_ms)
        if deadline_s is None:
            deadline_s = wait_ms / 1000 + _HELPER_SLACK_S
        status, data = self._helper(vm, line, None, deadline_s,
                                    view=True, limit=view_size(max_bytes))
        return self._view(vm, exec_id, status, data, max_bytes)

    def exec_input(self, vm: Vm, exec_id: str, data: bytes, *, eof: bool) -> int:
        """Write `data` to the exec's stdin (then close it, with `eof`); answers the
        bytes written. GuestExecError when it ended or its stdin is closed."""
        status, out = self._helper(vm, input_command(exec_id, eof=eof), data,
                                   self.file_timeout_s, view=False, limit=_SMALL_ANSWER)
        if status in (NO_SUCH_EXEC, EXEC_ENDED):
            raise GuestExecError(exec_id, "ended", vm_id=vm.id)
        if status == STDIN_CLOSED:
            raise GuestExecError(exec_id, "stdin_closed", vm_id=vm.id)
        if status != 0:
            raise GuestError(f"rift-exec input failed (exit {status}): {out[-200:]!r}",
                             vm_id=vm.id)
        return len(data)

    def exec_kill(self, vm: Vm, exec_id: str, signal: Literal["TERM", "KILL"]) -> None:
        """Signal the exec's process group (TERM: KILL follows 5 s later in the guest).
        An exec that ended already is left as it is."""
        status, out = self._helper(vm, kill_command(exec_id, signal), None,
                                   _HELPER_SLACK_S, view=False, limit=_SMALL_ANSWER)
        if status not in (0, NO_SUCH_EXEC):
            raise GuestError(f"rift-exec kill failed (exit {status}): {out[-200:]!r}",
                             vm_id=vm.id)

    def _view(self, vm: Vm, exec_id: str, status: int | None, data: bytes,
              max_bytes: int) -> GuestExec:
        if status == NO_SUCH_EXEC:
            raise GuestExecError(exec_id, "unknown", vm_id=vm.id)
        try:
            return parse_view(data, max_bytes)
        except ViewError as exc:
            raise GuestError(f"rift-exec answered no view (exit {status}): {exc}",
                             vm_id=vm.id) from exc

    def _helper(self, vm: Vm, line: str, stdin: bytes | None, timeout_s: float, *,
                view: bool, limit: int) -> tuple[int | None, bytes]:
        """Run one rift-exec command on a pooled connection: (its exit status, what
        it printed, at most `limit` bytes). Each ends soon: `start` and `read` once
        their wait is over (an exec's keeper is a process of its own)."""
        status, data = self._helper_once(vm, line, stdin, timeout_s, view=view, limit=limit)
        if status == _NOT_FOUND and self.helper_binary is not None:
            # A guest Rift did not build (a qcow2 image) has no rift-exec: give it one.
            self._upload_helper(vm)
            status, data = self._helper_once(vm, line, stdin, timeout_s, view=view,
                                             limit=limit)
        return status, data

    def _upload_helper(self, vm: Vm) -> None:
        assert self.helper_binary is not None
        try:
            binary = self.helper_binary().read_bytes()
        except (ImageError, OSError) as exc:
            raise GuestError(f"the guest has no rift-exec and none is at hand: {exc}",
                             vm_id=vm.id) from exc
        folder = GUEST_PATH.rsplit("/", 1)[0]
        aside = f"{GUEST_PATH}.new.$$"  # calls racing to put it there each write their own
        script = (f"mkdir -p {folder} && cat > {aside} && chmod 755 {aside} "
                  f"&& mv -f {aside} {GUEST_PATH}")
        collected = self._run(vm, script, binary, self.file_timeout_s, 4096)
        if collected.exit_code != 0:
            raise GuestError("could not put rift-exec into the guest: " + collected.stderr
                             .decode("utf-8", "replace").strip()[-200:], vm_id=vm.id)
        log.info("rift-exec put into guest %s", vm.id)

    def _helper_once(self, vm: Vm, line: str, stdin: bytes | None, timeout_s: float, *,
                     view: bool, limit: int) -> tuple[int | None, bytes]:
        """What the guest answers is hostile (SPEC §15): read until `limit` bytes
        (more is GuestError), every step by the deadline, the connection closed by
        the watchdog when paramiko waits past it."""
        address = _address(vm)
        self._remember(vm)
        deadline = time.monotonic() + timeout_s
        guard: Guard | None = None
        try:
            with self._pool.lease(vm.id, address, timeout_s) as transport, \
                    self._watchdog.guard(deadline + _GRACE_S, transport.close) as guard:
                chan = transport.open_session(timeout=_left(deadline, self.connect_timeout_s))
                try:
                    chan.exec_command(line)
                    if stdin:
                        send_within(chan, stdin, deadline)
                    chan.shutdown_write()
                    data = _read_capped(chan, deadline, limit, vm.id)
                    if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
                        raise GuestError("rift-exec did not end", vm_id=vm.id)
                    status = chan.recv_exit_status()
                    err = chan.recv_stderr(4096) if chan.recv_stderr_ready() else b""
                finally:
                    chan.close()
        except TimeoutError as exc:
            raise GuestError(f"rift-exec did not answer within {timeout_s:.0f}s: {exc}",
                             vm_id=vm.id) from exc
        except _FAILURES as exc:
            if guard is not None and guard.fired:
                raise GuestError(f"rift-exec did not answer within {timeout_s:.0f}s; its "
                                 "connection was closed", vm_id=vm.id) from exc
            raise GuestError(f"the SSH session to the guest failed: {exc}", vm_id=vm.id) from exc
        if view and status not in (0, NO_SUCH_EXEC, _NOT_FOUND):
            raise GuestError(f"rift-exec failed (exit {status})"
                             f"{': ' + repr(err[-200:]) if err else ''}", vm_id=vm.id)
        return status, data

    # life cycle

    def connect_when_ready(self, vm: Vm, serial_log: Path, timeout_s: float, *,
                           markers: bool = True) -> None:
        """Wait for the guest's ready marker, pin the host key it printed, and
        open a pooled connection, so the first call finds one open.
        GuestError after `timeout_s` seconds.

        Without `markers` (an image Rift did not build, e.g. a qcow2 with
        cloud-init, prints none), only SSH counts: log in again and again, each
        try bounded, until one succeeds. The host key of the first login that
        succeeds is pinned; a failed try pins nothing (sshd may answer before
        cloud-init has installed the key, or with host keys it replaces).
        """
        deadline = time.monotonic() + timeout_s
        if self._keeper is not None:
            self._keeper.start()
        with self._lock:
            self._closed.discard(vm.id)  # a boot under this id starts now
            if markers:
                self._serial[vm.id] = serial_log

        def gone() -> bool:
            with self._lock:
                return vm.id in self._closed

        self._remember(vm)
        console = self._console(vm.id, serial_log)
        if markers:
            host_key = wait_for_marker(console, deadline, gone=gone)
            if host_key is not None:
                self.pin_host_key(vm.id, host_key)
        address = _address(vm)
        while True:
            remaining = deadline - time.monotonic()
            try:
                transport = self._connect(vm.id, address, timeout_s=None if markers else
                                          max(1.0, min(self.connect_timeout_s, remaining)))
            except GuestError as exc:
                if not markers:
                    with self._lock:
                        self._host_keys.pop(vm.id, None)
                if gone():
                    raise GuestError("the VM was destroyed while it booted",
                                     vm_id=vm.id) from exc
                if time.monotonic() >= deadline:
                    if markers:
                        raise
                    tail = serial_tail(console)
                    raise GuestError(f"no SSH login succeeded (last: {exc.message})"
                                     + (f"; the serial console ends with: {tail!r}"
                                        if tail else ""), vm_id=vm.id) from exc
                time.sleep(0.1 if markers else _LOGIN_RETRY_S)
                continue
            self._pool.add(vm.id, address, transport)
            return

    def standby(self, vm: Vm) -> None:
        """Open, on a connection of its own, a shell in the pooled guest `vm` that
        waits for the hand-over's lines: the hand-over then starts no process in
        the guest (each costs tens of milliseconds under TCG). Replaces one open
        before; GuestError when the guest does not take it."""
        address = _address(vm)
        self._remember(vm)
        transport = self._connect(vm.id, address)
        deadline = time.monotonic() + _HAND_OVER_S
        try:
            with self._watchdog.guard(deadline + _GRACE_S, transport.close):
                chan = transport.open_session(timeout=_left(deadline, self.connect_timeout_s))
                chan.exec_command(STANDBY_SHELL)
                send_within(chan, f"{HAND_OVER_FUNCTION}\n".encode(), deadline)
                # A rehearsal with the key the guest has now: a first run pays what a
                # guest pays for code and files nothing has touched since its boot
                # (about 100 ms under TCG), so the real hand-over does not.
                status = _in_standby(chan, hand_over_call(self._login_key_line(vm),
                                                          time.time(), secrets.token_bytes(32)),
                                     deadline)
        except (*_FAILURES, TimeoutError) as exc:
            transport.close()
            raise GuestError(f"the standby shell did not start: {exc}", vm_id=vm.id) from exc
        if status != 0:
            transport.close()
            raise GuestError(f"the standby shell's rehearsal failed (exit {status})",
                             vm_id=vm.id)
        with self._lock:
            old = self._standby.pop(vm.id, None)
            self._standby[vm.id] = (transport, chan)
        if old is not None:
            old[0].close()

    def _login_key_line(self, vm: Vm) -> str:
        """The public key line the VM's root accepts now (its task's, or its pool's)."""
        with self._lock:
            task_id = self._task_of.get(vm.id, vm.task_id)
        return public_line(load_key(key_path(self.keys_dir, task_id)))

    def hand_over(self, vm: Vm, public_key_line: str, task_id: str, now: float) -> None:
        """Run, on the pooled guest `vm` (its `task_id` names the pool key), the
        hand-over: root's authorized key becomes `public_key_line`, its clock `now`
        (where it is more than a second off), and 32 random bytes of this host go
        into the guest's entropy pool. It runs in the standby shell when one is
        open (whose connection then serves the VM's calls), else on a pooled
        connection. From then on the VM's connections log in with `task_id`'s key.

        The pool key stays on this host as the VM's boot key (a file named by the
        VM id): a reboot inside the guest brings it back from the kernel command
        line, and the next login then hands the VM over again (see _connect)."""
        keep_boot_key(self.keys_dir, vm.task_id, vm.id)
        entropy = secrets.token_bytes(32)
        with self._lock:
            held = self._standby.pop(vm.id, None)
        if held is not None:
            transport, chan = held
            deadline = time.monotonic() + _HAND_OVER_S
            try:
                with self._watchdog.guard(deadline + _GRACE_S, transport.close):
                    status = _in_standby(chan, hand_over_call(public_key_line, now, entropy),
                                         deadline)
            except (*_FAILURES, TimeoutError) as exc:
                log.info("standby shell of %s failed (%s); handing over anew", vm.id, exc)
                status = None
            chan.close()
            if status == 0:
                with self._lock:
                    self._task_of[vm.id] = task_id
                self._pool.add(vm.id, _address(vm), transport)
                return
            transport.close()
            if status is not None:
                raise GuestError(f"the hand-over failed (exit {status})", vm_id=vm.id)
        collected = self._run(vm, hand_over_script(public_key_line, now, entropy), None,
                              _HAND_OVER_S, 4096)
        if collected.exit_code != 0:
            reason = collected.stderr.decode("utf-8", "replace").strip()
            raise GuestError(f"the hand-over failed (exit {collected.exit_code}): {reason}",
                             vm_id=vm.id)
        with self._lock:
            self._task_of[vm.id] = task_id

    def host_key(self, vm_id: str) -> str | None:
        with self._lock:
            return self._host_keys.get(vm_id)

    def reconnect(self, vm: Vm, host_key: str | None, timeout_s: float) -> None:
        """Drop the VM's connections (a restore cut them), pin `host_key`, and log in
        again and again until one succeeds or `timeout_s` passes (GuestError)."""
        self._pool.close_vm(vm.id)
        if host_key is not None:
            self.pin_host_key(vm.id, host_key)
        self._remember(vm)
        address = _address(vm)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                transport = self._connect(vm.id, address, timeout_s=max(
                    1.0, min(self.connect_timeout_s, deadline - time.monotonic())))
            except GuestError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
                continue
            self._pool.add(vm.id, address, transport)
            return

    def drop_connections(self, vm_id: str) -> None:
        """Close the VM's connections (calls in flight fail), keeping its host key
        pinned and its task known: a pause is about to cut them."""
        self._pool.close_vm(vm_id)
        self._close_tunnel(vm_id)
        with self._lock:
            standby = self._standby.pop(vm_id, None)
        if standby is not None:
            standby[0].close()

    def set_clock(self, vm: Vm, now: float) -> None:
        """Set the guest's clock to `now` (a restore brings back the clock it was
        saved with)."""
        collected = self._run(vm, f'date -s "@{round(now)}" >/dev/null', None,
                              _HAND_OVER_S, 4096)
        if collected.exit_code != 0:
            reason = collected.stderr.decode("utf-8", "replace").strip()
            raise GuestError(f"setting the clock failed (exit {collected.exit_code}): "
                             f"{reason}", vm_id=vm.id)

    def refresh_identity(self, vm: Vm, mac: str) -> str:
        """Give a fork (a guest restored from another's saved state) an identity of
        its own: a new SSH host key (its SSH server started anew with it; this
        connection stays), the MAC `mac` on its network interface (in Rift's own
        images: a cloud image's network configuration matches its MAC), fresh
        bytes of this host mixed into its entropy pool and its random number
        generator reseeded from it, and this host's clock (`rift-exec identity`).
        Pins and answers the new host key line."""
        def once() -> Collected:
            script = identity_script(mac, secrets.token_bytes(32), time.time())
            return self._run(vm, script, None, _HAND_OVER_S * 4, 4096)

        collected = once()
        if collected.exit_code in _OLD_HELPER and self.helper_binary is not None:
            self._upload_helper(vm)  # a guest with an older rift-exec, or none: again
            collected = once()
        status = collected.exit_code
        if status != 0:
            reason = collected.stderr.decode("utf-8", "replace").strip()[-300:]
            raise GuestError(f"the fork's new identity failed (exit {status}): {reason}",
                             vm_id=vm.id)
        lines = collected.stdout.decode("utf-8", "replace").split("\n")
        key_line = next((line for line in reversed(lines) if line.startswith("ssh-")), None)
        if key_line is None:
            raise GuestError("the fork's new host key was not printed", vm_id=vm.id)
        self.pin_host_key(vm.id, key_line.strip())
        with self._lock:
            self._restarting[vm.id] = time.monotonic() + _RESTART_S
        return key_line.strip()

    def pin_host_key(self, vm_id: str, host_key_line: str) -> None:
        """Accept only this host key from the VM (else the first one seen is pinned)."""
        with self._lock:
            self._host_keys[vm_id] = host_key_line

    def open_port(self, vm: Vm, port: int, timeout_s: float) -> paramiko.Channel:
        """A byte stream to TCP `port` on the guest's loopback: a `direct-tcpip`
        channel on the VM's tunnel connection, which carries every exposure's
        channels at once (opened on first use, again when it died). GuestError
        when the guest cannot be reached; GuestPortClosed when nothing listens."""
        address = _address(vm)
        self._remember(vm)
        for attempt in (1, 2):
            with self._lock:
                transport = self._tunnels.get(vm.id)
            if transport is None or not transport.is_active():
                transport = self._connect(vm.id, address, timeout_s=timeout_s)
                with self._lock:
                    old = self._tunnels.get(vm.id)
                    self._tunnels[vm.id] = transport
                if old is not None:
                    old.close()
            try:
                return transport.open_channel("direct-tcpip", ("127.0.0.1", port),
                                              ("127.0.0.1", 0), timeout=timeout_s)
            except paramiko.ChannelException as exc:
                raise GuestPortClosed(port, str(exc), vm_id=vm.id) from exc
            except (paramiko.SSHException, EOFError, OSError) as exc:
                with self._lock:
                    if self._tunnels.get(vm.id) is transport:
                        del self._tunnels[vm.id]
                transport.close()
                if attempt == 2:
                    raise GuestError(f"no channel to port {port}: {exc}", vm_id=vm.id) from exc
        raise AssertionError("unreachable")

    def _close_tunnel(self, vm_id: str) -> None:
        with self._lock:
            tunnel = self._tunnels.pop(vm_id, None)
        if tunnel is not None:
            tunnel.close()

    def connections(self, vm_id: str) -> int:
        """How many SSH connections to the VM are open now."""
        return self._pool.count(vm_id)

    def close_vm(self, vm_id: str) -> None:
        """Close the VM's connections (calls in flight fail) and forget its host key."""
        self._pool.close_vm(vm_id)
        self._close_tunnel(vm_id)
        with self._lock:
            self._host_keys.pop(vm_id, None)
            self._task_of.pop(vm_id, None)
            self._restarting.pop(vm_id, None)
            self._serial.pop(vm_id, None)
            standby = self._standby.pop(vm_id, None)
            self._closed.add(vm_id)
        if standby is not None:
            standby[0].close()

    def close(self) -> None:
        self._pool.close()
        self._watchdog.stop()
        if self._keeper is not None:
            self._keeper.stop()
        with self._lock:
            tunnels = list(self._tunnels.values())
            self._tunnels.clear()
        for tunnel in tunnels:
            tunnel.close()
        with self._lock:
            self._host_keys.clear()
            self._task_of.clear()
            self._serial.clear()
            standbys = list(self._standby.values())
            self._standby.clear()
            self._closed.clear()
        for transport, _chan in standbys:
            transport.close()

    # connecting

    def _remember(self, vm: Vm) -> None:
        with self._lock:
            self._task_of[vm.id] = vm.task_id
            self._host_of[vm.id] = vm.host

    def _target(self, vm_id: str) -> SshTarget | None:
        """The SSH of the VM's host when that is elsewhere; None on this machine."""
        with self._lock:
            host = self._host_of.get(vm_id)
        if host is None or self.links is None or self.host_uri is None:
            return None
        uri = self.host_uri(host)
        return ssh_target(uri) if uri is not None else None

    def _open(self, vm_id: str, address: tuple[str, int], timeout: float) -> Any:
        """A stream to the guest's SSH: a socket here, or a channel through its host."""
        target = self._target(vm_id)
        if target is not None and self.links is not None:
            try:
                return self.links.channel(target, address[1], timeout)
            except HostLinkError as exc:
                raise GuestError(str(exc), vm_id=vm_id) from exc
        try:
            sock = socket.create_connection(address, timeout=timeout)
        except OSError as exc:
            raise GuestError(f"cannot connect to {address[0]}:{address[1]}: {exc}",
                             vm_id=vm_id) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # else ~40 ms per call
        return sock

    def _on_hosts(self, command: str) -> None:
        """Run `command` on each host elsewhere Rift is connected to (the keeper's cut)."""
        if self.links is None:
            return
        for target in self.links.targets():
            try:
                self.links.run(target, command, timeout_s=30.0)
            except HostLinkError as exc:
                log.info("console logs on %s not checked: %s", target.host, exc)

    def _console(self, vm_id: str, serial_log: Path) -> Console:
        """The VM's serial console: its file here, or read on its host."""
        target = self._target(vm_id)
        links = self.links
        if target is None or links is None:
            return serial_log

        def read() -> bytes | None:
            try:
                return links.read_tail(target, str(serial_log), TAIL_BYTES)
            except HostLinkError:
                return None

        return read

    def _connect(self, vm_id: str, address: tuple[str, int], *,
                 timeout_s: float | None = None) -> paramiko.Transport:
        """A logged-in connection; while a fork's SSH server restarts with its new
        host key (`refresh_identity`), a refused login is tried again."""
        while True:
            try:
                return self._connect_once(vm_id, address, timeout_s=timeout_s)
            except GuestError:
                with self._lock:
                    until = self._restarting.get(vm_id, 0.0)
                if time.monotonic() >= until:
                    raise
                time.sleep(0.02)

    def _connect_once(self, vm_id: str, address: tuple[str, int], *,
                      timeout_s: float | None = None) -> paramiko.Transport:
        timeout = self.connect_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            task_id = self._task_of.get(vm_id)
        if task_id is None:
            raise GuestError(f"VM {vm_id} is not known to the guest shell", vm_id=vm_id)
        try:
            pkey = load_key(key_path(self.keys_dir, task_id))
        except (OSError, ValueError, paramiko.SSHException) as exc:
            raise GuestError(f"task {task_id} has no usable key ({type(exc).__name__})",
                             vm_id=vm_id) from exc
        sock = self._open(vm_id, address, timeout)
        transport = paramiko.Transport(sock, default_window_size=self.window_bytes)
        # banner, key exchange, host key check, login (and a hand-over again) each have
        # a timeout; the watchdog bounds them together, whatever the guest does
        deadline = time.monotonic() + 3 * timeout + _HAND_OVER_S
        guard: Guard | None = None
        try:
            with self._watchdog.guard(deadline, transport.close) as guard:
                transport.banner_timeout = timeout
                transport.auth_timeout = timeout
                transport.start_client(timeout=timeout)
                self._check_host_key(vm_id, transport.get_remote_server_key())
                try:
                    transport.auth_publickey(self.user, pkey)
                except paramiko.AuthenticationException:
                    if not self._hand_over_again(vm_id, transport, pkey):
                        raise
        except GuestError:
            transport.close()
            raise
        except _FAILURES as exc:
            transport.close()
            late = " (past its deadline)" if guard is not None and guard.fired else ""
            raise GuestError(f"SSH to {address[0]}:{address[1]} failed{late}: {exc}",
                             vm_id=vm_id) from exc
        transport.set_keepalive(30)
        return transport

    def _check_host_key(self, vm_id: str, key: paramiko.PKey) -> None:
        line = f"{key.get_name()} {key.get_base64()}"
        with self._lock:
            pinned = self._host_keys.setdefault(vm_id, line)
        if same_key(key, pinned):
            return
        # A guest that rebooted made itself a new host key and printed it on its
        # console, which is where the first one was pinned from: pin the new one.
        serial_log = self._serial_log(vm_id)
        printed = (read_markers(self._console(vm_id, serial_log))[1]
                   if serial_log is not None else None)
        if printed is not None and same_key(key, printed):
            log.info("guest %s rebooted: its new host key is pinned", vm_id)
            with self._lock:
                self._host_keys[vm_id] = printed
            return
        raise GuestError("the guest's SSH host key changed; is another process on its "
                         "port?", vm_id=vm_id)

    def _serial_log(self, vm_id: str) -> Path | None:
        with self._lock:
            known = self._serial.get(vm_id)
        if known is not None:
            return known
        return None if self.serial_dir is None else self.serial_dir / f"{vm_id}.log"

    def _hand_over_again(self, vm_id: str, transport: paramiko.Transport,
                         task_key: paramiko.PKey) -> bool:
        """After the task's key was refused: log in with the VM's boot key (a pooled
        VM that rebooted has its pool's key again) and hand the VM over anew on this
        connection. False when the VM has no boot key or the guest takes neither."""
        try:
            boot_key = load_key(key_path(self.keys_dir, vm_id))
        except (OSError, ValueError, paramiko.SSHException):
            return False
        transport.auth_publickey(self.user, boot_key)
        collected = self._session(
            transport, hand_over_script(public_line(task_key), time.time(),
                                        secrets.token_bytes(32)),
            None, time.monotonic() + _HAND_OVER_S, 4096)
        if collected.exit_code != 0:
            raise GuestError(f"the hand-over after a reboot failed (exit "
                             f"{collected.exit_code})", vm_id=vm_id)
        log.info("guest %s came back with its boot key: handed over again", vm_id)
        return True

    # running

    def _run(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: float,
             out_cap: int) -> Collected:
        """Run `command` in the guest on a pooled connection; past `timeout_s`, kill it.
        Output is kept up to the caps (the rest is read and dropped); a step paramiko
        waits on past the deadline and the kill's wait gets the connection closed."""
        address = _address(vm)
        self._remember(vm)
        guard: Guard | None = None
        try:
            with self._pool.lease(vm.id, address, timeout_s) as transport:
                deadline = time.monotonic() + timeout_s
                with self._watchdog.guard(deadline + _KILL_WAIT_S + _GRACE_S,
                                          transport.close) as guard:
                    collected = self._session(transport, command, stdin, deadline, out_cap)
                    if collected.timed_out and collected.pid is not None:
                        # The timed-out channel is closed by now; the kill runs after it on
                        # the same connection (never two channels at once: rift.guest.pool).
                        killed = self._session(transport, kill_line(collected.pid), None,
                                               time.monotonic() + _KILL_WAIT_S, 4096)
                        if killed.timed_out:
                            log.warning("could not kill a timed-out command in %s", vm.id)
        except _FAILURES as exc:
            if guard is not None and guard.fired:
                raise GuestError(f"the guest did not answer within {timeout_s:.0f}s; its "
                                 "connection was closed", vm_id=vm.id) from exc
            raise GuestError(f"the SSH session to the guest failed: {exc}", vm_id=vm.id) from exc
        return collected

    def _session(self, transport: paramiko.Transport, command: str, stdin: bytes | None,
                 deadline: float, out_cap: int) -> Collected:
        """One channel: run, collect, read the exit status, close."""
        chan = transport.open_session(timeout=_left(deadline, self.connect_timeout_s))
        try:
            chan.exec_command(command_line(command))
            feeder = feed_stdin(chan, stdin, deadline)
            collected = collect(chan, stdout_cap=out_cap, stderr_cap=self.output_cap,
                                deadline=deadline, wait=lambda t: _wait(chan, t),
                                alive=transport.is_active, header=True)
            if chan.exit_status_ready():
                chan.recv_exit_status()
            if feeder is not None:
                feeder.join(0.5)
        finally:
            chan.close()
        return collected

    def _file_op(self, vm: Vm, path: str, script: str, data: bytes | None, *,
                 cap: int | None = None, timeout_s: float | None = None) -> bytes:
        timeout_s = self.file_timeout_s if timeout_s is None else timeout_s
        collected = self._run(vm, script, data, timeout_s,
                              (self.file_cap if cap is None else cap) + 1)
        if collected.timed_out:
            raise GuestError(f"{path}: the transfer took longer than {timeout_s:.0f}s",
                             vm_id=vm.id)
        if collected.exit_code == 0:
            return collected.stdout
        reason = shell_reason(collected.stderr)
        if collected.exit_code is None:
            raise GuestError(f"{path}: the guest sent no exit status", vm_id=vm.id)
        raise GuestFileError(path, reason or f"failed with exit code {collected.exit_code}",
                             vm_id=vm.id)


# The standby shell: bash where there is one (its builtins read the clock), else sh.
STANDBY_SHELL = "command -v bash >/dev/null && exec bash -s; exec sh -s"
_HANDED = b"rift-handed-"


def _handed(seen: bytes) -> int | None:
    """The status in the first whole `rift-handed-N` line of `seen` (no pattern)."""
    at = seen.find(_HANDED)
    while at >= 0:
        end = seen.find(b"\n", at)
        if end < 0:
            return None
        digits = seen[at + len(_HANDED):end]
        if digits.isdigit() and len(digits) <= 3:
            return int(digits)
        at = seen.find(_HANDED, at + 1)
    return None


# The hand-over as a shell function, for busybox sh and bash alike, in builtins:
# every process a guest starts under TCG costs tens of milliseconds. The key file
# exists (the init made it, mode 0600) and is rewritten in place. bash reads the
# guest's clock itself (`printf %()T`) and runs `date -s` only when it is more than
# a second off; sh always sets it. The standby shell is given it ahead of time, so
# the hand-over sends one short line (bash reads a pipe a byte at a time).
HAND_OVER_FUNCTION = (
    "rift_hand_over() { printf '%s\\n' \"$1\" > /root/.ssh/authorized_keys "
    "&& printf '%s' \"$2\" > /dev/urandom "
    "&& { if [ -n \"$BASH_VERSION\" ]; then printf -v g '%(%s)T' -1; "
    "[ $((g - $3)) -ge -1 ] && [ $((g - $3)) -le 1 ]; else false; fi "
    "|| date -s \"@$3\" >/dev/null; }; }"
)


# A fork's new identity (refresh_identity), for busybox sh and bash alike: the new
# host key's line printed first, then `rift-exec identity` (one static process: a
# program started under TCG costs about a hundred milliseconds) writes the key, the
# MAC (on Rift's own images: a cloud image's network configuration matches its
# MAC), the entropy and the clock, and starts the SSH server anew with the key in
# the background, RIFT_SETTLE_MS later: the agent's first calls run on the
# connection open now and have the guest's one vCPU to themselves (a login
# meanwhile is retried, see `_connect`). dropbear (`tiny`) makes its key itself,
# in its own format; sshd gets the one made on the control plane.
_IDENTITY = r"""
set -e
mac=-
if [ -x /usr/lib/rift/busybox ] || [ -f /run/dropbear.pid ]; then mac=$RIFT_MAC; fi
if [ -f /run/dropbear.pid ]; then
  k=/etc/dropbear/dropbear_ed25519_host_key
  rm -f "$k.new"
  set -- $(dropbearkey -t ed25519 -f "$k.new" 2>/dev/null | grep '^ssh-')
  mv -f "$k.new" "$k"
  echo "$1 $2"
  exec "$RIFT_EXEC" identity / "$mac" "$RIFT_NOW_CS" "$RIFT_SETTLE_MS" "$k" /run/dropbear.pid \
    -- dropbear -s -k -p 22 -r "$k" -W 1048576 -P /run/dropbear.pid <<RIFT_END
$RIFT_ENTROPY


RIFT_END
fi
echo "$RIFT_HOST_PUB"
pidfile=/run/sshd.pid; set --
[ -f "$pidfile" ] || { pidfile=-; set -- -- systemctl reload ssh.service; }
exec "$RIFT_EXEC" identity / "$mac" "$RIFT_NOW_CS" "$RIFT_SETTLE_MS" \
  /etc/ssh/ssh_host_ed25519_key "$pidfile" "$@" <<RIFT_END
$RIFT_ENTROPY
$RIFT_HOST_PUB
$RIFT_HOST_KEY
RIFT_END
"""
_OLD_HELPER = (2, 127)  # `identity` refused as usage (an older rift-exec), or none there


def identity_script(mac: str, entropy: bytes, now: float) -> str:
    """The whole of a fork's new identity, its values up front: an ed25519 host key
    made here for sshd (ssh-keygen in the guest costs a few hundred milliseconds
    under TCG; dropbear makes its own, in its own format, at once)."""
    private, public = new_host_key()
    return (f"RIFT_MAC={shlex.quote(mac)} RIFT_ENTROPY={entropy.hex()} "
            f"RIFT_NOW_CS={round(now * 100)} RIFT_EXEC={GUEST_PATH} "
            f"RIFT_SETTLE_MS={round(_SETTLE_S * 1000)} "
            f"RIFT_HOST_KEY={shlex.quote(private)} RIFT_HOST_PUB={shlex.quote(public)}\n"
            f"{_IDENTITY}")


def hand_over_call(public_key_line: str, now: float, entropy: bytes) -> str:
    """The line that runs the hand-over: the task's key, fresh bytes, the host's clock."""
    return f"rift_hand_over {shlex.quote(public_key_line)} {entropy.hex()} {round(now)}"


def hand_over_script(public_key_line: str, now: float, entropy: bytes) -> str:
    """The whole hand-over, for a shell that was not given the function."""
    return f"{HAND_OVER_FUNCTION}\n{hand_over_call(public_key_line, now, entropy)}"


def _in_standby(chan: paramiko.Channel, script: str, deadline: float) -> int | None:
    """Run `script` in the standby shell; its exit status, None if the shell ended."""
    send_within(chan, f"{script}\necho rift-handed-$?\n".encode(), deadline)
    seen = b""
    while True:
        found = _handed(seen)
        if found is not None:
            return found
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the standby shell did not answer")
        chan.settimeout(remaining)
        data = chan.recv(4096)
        if not data:
            return None
        seen = (seen + data)[-4096:]


def shell_reason(stderr: bytes) -> str:
    """A failed command's stderr without the shell's `sh: ` and `eval: line N: `
    prefixes, at most _REASON_MAX characters (split, no pattern: it is the guest's)."""
    text = stderr[:4 * _REASON_MAX].decode("utf-8", "replace").strip()
    first, sep, rest = text.partition(": ")
    if sep and first.endswith("sh") and " " not in first:
        text = rest
    if text.startswith("eval: line "):
        number, sep, rest = text.removeprefix("eval: line ").partition(": ")
        if sep and number.isdigit():
            text = rest
    return text[:_REASON_MAX]


def _left(deadline: float, at_most: float) -> float:
    """The time a step may take: what is left until `deadline`, at most `at_most`
    (and a little, so that a step past the deadline fails rather than not start)."""
    return max(0.01, min(at_most, deadline - time.monotonic()))


def _read_capped(chan: paramiko.Channel, deadline: float, limit: int, vm_id: str) -> bytes:
    """The channel's stdout to its end: GuestError past `deadline` or past `limit`
    bytes (a guest that floods costs its own call, and no memory)."""
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise GuestError("rift-exec did not answer in time", vm_id=vm_id)
        chan.settimeout(remaining)
        chunk = chan.recv(min(1 << 16, limit + 1 - len(data)))
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise GuestError(f"rift-exec answered more than the {limit} bytes asked for",
                             vm_id=vm_id)


def _wait(chan: paramiko.Channel, seconds: float) -> None:
    if chan.eof_received:
        # After EOF the channel's pipe stays readable: wait for the exit status instead.
        chan.status_event.wait(seconds)
        return
    with contextlib.suppress(ValueError, OSError):
        select.select([chan], [], [], seconds)


def _address(vm: Vm) -> tuple[str, int]:
    if vm.ssh_host is None or vm.ssh_port is None:
        raise GuestError(f"VM {vm.id} has no SSH address", vm_id=vm.id)
    return vm.ssh_host, vm.ssh_port


def _absolute(path: str, vm: Vm) -> None:
    if not path.startswith("/"):
        raise GuestFileError(path, "the path must be absolute", vm_id=vm.id)
