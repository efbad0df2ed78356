"""What the parts of a guest shell share: the settings, the per-VM SSH connections
(rift.guest.pool: one channel at a time per connection, a few connections per VM
for concurrent calls, dead ones replaced), the host keys pinned for each VM, the
task whose key each VM's root accepts, and the watchdog that closes a connection
whose call is stuck past its deadline (rift.guest.watchdog).

Logins use the task's key (rift.guest.keys). Each call runs on its own channel,
whose exit status is read and which is closed before the connection serves
another call (dropbear fails later channels otherwise). Every paramiko or socket
failure becomes GuestError.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

from rift.domain.model import Vm
from rift.guest.errors import GuestError
from rift.guest.keys import key_path, load_key, public_line
from rift.guest.pool import ConnectionPool
from rift.guest.ready import read_markers, same_key
from rift.guest.routes import Routes
from rift.guest.run import Collected, Reading, collect, command_line, feed_stdin
from rift.guest.scripts import hand_over_script
from rift.guest.steps import left, wait
from rift.guest.trust import GuestCa
from rift.guest.watchdog import Guard, Watchdog

log = logging.getLogger("rift.guest.shell")

MIB = 1024 * 1024
FAILURES = (paramiko.SSHException, OSError, EOFError, ConnectionError)
HAND_OVER_S = 10.0  # a hand-over is a few shell builtins: its guest is gone past this
GRACE_S = 1.0  # past a call's deadline, the watchdog closes a connection stuck in paramiko


@dataclass(frozen=True, kw_only=True)
class ShellSettings:
    """How a guest shell logs in and how much it waits for and keeps."""

    user: str = "root"
    connect_timeout_s: float = 10.0
    output_cap: int = 1 * MIB
    file_cap: int = 16 * MIB
    file_timeout_s: float = 300.0
    helper_slack_s: float = 15.0  # past an exec helper call's own wait (RIFT_HELPER_SLACK_S)
    window_bytes: int = 4 * MIB
    connections_per_vm: int = 4
    serial_dir: Path | None = None  # where `<vm id>.log` holds each guest's console
    # Commands of guests with an egress allowlist name the egress proxy (SPEC §13),
    # which QEMU's user network shows them at 10.0.2.2 (the host's loopback).
    egress_proxy_port: int | None = None
    console_cap_bytes: int | None = None  # the serial logs' cap (rift.guest.console)
    guest_ca: GuestCa | None = None  # RIFT_GUEST_CA_FILE's certificates (rift.guest.trust)


class Connections:
    """The SSH connections to guests, and what logging in to each needs."""

    def __init__(self, keys_dir: Path, settings: ShellSettings, routes: Routes) -> None:
        self.keys_dir = keys_dir
        self.settings = settings
        self.routes = routes
        self.lock = threading.Lock()
        self.host_keys: dict[str, str] = {}  # vm id -> pinned host key line
        self.task_of: dict[str, str] = {}  # vm id -> task id, for the login key
        # vm id -> (connection, shell) of a pooled VM waiting for its hand-over
        self.standby: dict[str, tuple[paramiko.Transport, paramiko.Channel]] = {}
        # VMs put away (close_vm) since their boot wait began: the wait ends at once
        self.closed: set[str] = set()
        # VM id -> until when its SSH server may still be restarting (a fork's)
        self.restarting: dict[str, float] = {}
        self.serial: dict[str, Path] = {}  # vm id -> serial log given by its boot wait
        # VMs woken by an exec whose clock the next command sets (`owe_clock`)
        self.clock_owed: set[str] = set()
        # vm id -> the connection that carries its exposures' channels (many at once)
        self.tunnels: dict[str, paramiko.Transport] = {}
        self.pool: ConnectionPool[paramiko.Transport] = ConnectionPool(
            self.connect, per_vm=settings.connections_per_vm)
        # closes a connection whose call is stuck past its deadline (rift.guest.watchdog)
        self.watchdog = Watchdog()

    def owe_clock(self, vm_id: str) -> None:
        """The guest's clock is behind (a wake restored the one it was saved with):
        the next command run in it sets it first (`take_clock`)."""
        with self.lock:
            self.clock_owed.add(vm_id)

    def take_clock(self, vm_id: str) -> bool:
        """Whether the next command of `vm_id` is to set its clock to this host's
        first (then it no longer is; `owe_clock` again when the command did not
        reach the guest)."""
        with self.lock:
            if vm_id not in self.clock_owed:
                return False
            self.clock_owed.discard(vm_id)
        return True

    def remember(self, vm: Vm) -> None:
        with self.lock:
            self.task_of[vm.id] = vm.task_id
        self.routes.remember(vm.id, vm.host)

    def host_key(self, vm_id: str) -> str | None:
        with self.lock:
            return self.host_keys.get(vm_id)

    def pin_host_key(self, vm_id: str, host_key_line: str) -> None:
        """Accept only this host key from the VM (else the first one seen is pinned)."""
        with self.lock:
            self.host_keys[vm_id] = host_key_line

    def connect(self, vm_id: str, address: tuple[str, int], *,
                timeout_s: float | None = None) -> paramiko.Transport:
        """A logged-in connection; while a fork's SSH server restarts with its new
        host key (`refresh_identity`), a refused login is tried again."""
        while True:
            try:
                return self._connect_once(vm_id, address, timeout_s=timeout_s)
            except GuestError:
                with self.lock:
                    until = self.restarting.get(vm_id, 0.0)
                if time.monotonic() >= until:
                    raise
                time.sleep(0.02)

    def _connect_once(self, vm_id: str, address: tuple[str, int], *,
                      timeout_s: float | None = None) -> paramiko.Transport:
        timeout = self.settings.connect_timeout_s if timeout_s is None else timeout_s
        with self.lock:
            task_id = self.task_of.get(vm_id)
        if task_id is None:
            raise GuestError(f"VM {vm_id} is not known to the guest shell", vm_id=vm_id)
        try:
            pkey = load_key(key_path(self.keys_dir, task_id))
        except (OSError, ValueError, paramiko.SSHException) as exc:
            raise GuestError(f"task {task_id} has no usable key ({type(exc).__name__})",
                             vm_id=vm_id) from exc
        sock = self.routes.open(vm_id, address, timeout)
        transport = paramiko.Transport(sock, default_window_size=self.settings.window_bytes)
        # banner, key exchange, host key check, login (and a hand-over again) each have
        # a timeout; the watchdog bounds them together, whatever the guest does
        deadline = time.monotonic() + 3 * timeout + HAND_OVER_S
        guard: Guard | None = None
        try:
            with self.watchdog.guard(deadline, transport.close) as guard:
                transport.banner_timeout = timeout
                transport.auth_timeout = timeout
                transport.start_client(timeout=timeout)
                self._check_host_key(vm_id, transport.get_remote_server_key())
                try:
                    transport.auth_publickey(self.settings.user, pkey)
                except paramiko.AuthenticationException:
                    if not self._hand_over_again(vm_id, transport, pkey):
                        raise
        except GuestError:
            transport.close()
            raise
        except FAILURES as exc:
            transport.close()
            late = " (past its deadline)" if guard is not None and guard.fired else ""
            raise GuestError(f"SSH to {address[0]}:{address[1]} failed{late}: {exc}",
                             vm_id=vm_id) from exc
        transport.set_keepalive(30)
        return transport

    def _check_host_key(self, vm_id: str, key: paramiko.PKey) -> None:
        line = f"{key.get_name()} {key.get_base64()}"
        with self.lock:
            pinned = self.host_keys.setdefault(vm_id, line)
        if same_key(key, pinned):
            return
        # A guest that rebooted made itself a new host key and printed it on its
        # console, which is where the first one was pinned from: pin the new one.
        serial_log = self._serial_log(vm_id)
        printed = (read_markers(self.routes.console(vm_id, serial_log))[1]
                   if serial_log is not None else None)
        if printed is not None and same_key(key, printed):
            log.info("guest %s rebooted: its new host key is pinned", vm_id)
            with self.lock:
                self.host_keys[vm_id] = printed
            return
        raise GuestError("the guest's SSH host key changed; is another process on its "
                         "port?", vm_id=vm_id)

    def _serial_log(self, vm_id: str) -> Path | None:
        with self.lock:
            known = self.serial.get(vm_id)
        if known is not None:
            return known
        serial_dir = self.settings.serial_dir
        return None if serial_dir is None else serial_dir / f"{vm_id}.log"

    def _hand_over_again(self, vm_id: str, transport: paramiko.Transport,
                         task_key: paramiko.PKey) -> bool:
        """After the task's key was refused: log in with the VM's boot key (a pooled
        VM that rebooted has its pool's key again) and hand the VM over anew on this
        connection. False when the VM has no boot key or the guest takes neither."""
        try:
            boot_key = load_key(key_path(self.keys_dir, vm_id))
        except (OSError, ValueError, paramiko.SSHException):
            return False
        transport.auth_publickey(self.settings.user, boot_key)
        collected = self.session(
            transport, hand_over_script(public_line(task_key), time.time(),
                                        secrets.token_bytes(32)),
            None, time.monotonic() + HAND_OVER_S, 4096)
        if collected.exit_code != 0:
            raise GuestError(f"the hand-over after a reboot failed (exit "
                             f"{collected.exit_code})", vm_id=vm_id)
        log.info("guest %s came back with its boot key: handed over again", vm_id)
        return True

    def session(self, transport: paramiko.Transport, command: str, stdin: bytes | None,
                deadline: float, out_cap: int) -> Collected:
        """One channel: run, collect, read the exit status, close."""
        chan = transport.open_session(timeout=left(deadline, self.settings.connect_timeout_s))
        try:
            chan.exec_command(command_line(command))
            feeder = feed_stdin(chan, stdin, deadline)
            collected = collect(chan, Reading(
                stdout_cap=out_cap, stderr_cap=self.settings.output_cap, deadline=deadline,
                wait=lambda t: wait(chan, t), alive=transport.is_active, header=True))
            if chan.exit_status_ready():
                chan.recv_exit_status()
            if feeder is not None:
                feeder.join(0.5)
        finally:
            chan.close()
        return collected


    # closing

    def keep_tunnel(self, vm_id: str, transport: paramiko.Transport) -> None:
        """Make `transport` the VM's tunnel connection, closing the one before."""
        with self.lock:
            old = self.tunnels.get(vm_id)
            self.tunnels[vm_id] = transport
        if old is not None and old is not transport:
            old.close()

    def close_tunnel(self, vm_id: str) -> None:
        with self.lock:
            tunnel = self.tunnels.pop(vm_id, None)
        if tunnel is not None:
            tunnel.close()

    def drop(self, vm_id: str) -> None:
        """Close the VM's connections (calls in flight fail), keeping its host key
        pinned and its task known: a pause is about to cut them."""
        self.pool.close_vm(vm_id)
        self.close_tunnel(vm_id)
        with self.lock:
            standby = self.standby.pop(vm_id, None)
        if standby is not None:
            standby[0].close()

    def close_vm(self, vm_id: str) -> None:
        """Close the VM's connections (calls in flight fail) and forget its host key."""
        self.pool.close_vm(vm_id)
        self.close_tunnel(vm_id)
        with self.lock:
            self.host_keys.pop(vm_id, None)
            self.task_of.pop(vm_id, None)
            self.restarting.pop(vm_id, None)
            self.serial.pop(vm_id, None)
            self.clock_owed.discard(vm_id)
            standby = self.standby.pop(vm_id, None)
            self.closed.add(vm_id)
        if standby is not None:
            standby[0].close()

    def close(self) -> None:
        self.pool.close()
        self.watchdog.stop()
        with self.lock:
            tunnels = list(self.tunnels.values())
            self.tunnels.clear()
        for tunnel in tunnels:
            tunnel.close()
        with self.lock:
            self.host_keys.clear()
            self.task_of.clear()
            self.serial.clear()
            self.clock_owed.clear()
            standbys = list(self.standby.values())
            self.standby.clear()
            self.closed.clear()
        for transport, _chan in standbys:
            transport.close()
