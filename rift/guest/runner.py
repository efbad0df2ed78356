"""Running commands in a guest on a pooled connection, each bounded by its deadline
(the watchdog closes a connection paramiko waits on past it), and rift-exec's
commands (hypervisor/rift_exec.c), whose answers are read up to a limit: what a
guest answers is hostile (SPEC §15)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.exec_helper import GUEST_PATH
from rift.domain.egress import proxied, proxy_environment
from rift.domain.model import Vm
from rift.guest.connections import FAILURES, GRACE_S, HAND_OVER_S, Connections
from rift.guest.errors import GuestError
from rift.guest.exec_view import NO_SUCH_EXEC
from rift.guest.run import Collected, kill_line, send_within
from rift.guest.scripts import clock_prefix
from rift.guest.steps import address, left, read_capped
from rift.guest.warm import Warmer
from rift.guest.watchdog import Guard

log = logging.getLogger("rift.guest.shell")

KILL_WAIT_S = 5.0
# a wake by an exec leaves the clock to it; set alone this long after if no command came
CLOCK_OWED_S = 3.0
NOT_FOUND = 127  # the shell's exit status for a command it cannot find
USAGE = 2  # rift-exec's exit status for arguments it does not take


@dataclass(frozen=True, kw_only=True)
class HelperCall:
    """One rift-exec command: its line, its stdin, its deadline, whether it answers
    a view (any exit status but 0, `no such exec` and those in `also` is then an
    error), and the most bytes it may print. `clocked`, when the command can set
    the guest's clock itself (a `start`): its line doing so, to the time given in
    hundredths of a second since the epoch."""

    line: str
    clocked: Callable[[int], str] | None = None
    stdin: bytes | None = None
    timeout_s: float
    view: bool
    limit: int
    also: tuple[int, ...] = ()


class Runner:
    """Commands and rift-exec calls on the VM's pooled connections. `helper_binary`
    is rift-exec for guests without it (hypervisor.exec_helper; compiled on first
    use)."""

    def __init__(self, conns: Connections,
                 helper_binary: Callable[[], Path] | None = None) -> None:
        self.conns = conns
        self.helper_binary = helper_binary
        self.warmer = Warmer(conns)  # a call waits for its VM's warm-up in flight
        port = conns.settings.egress_proxy_port
        self.egress_environment = (
            proxy_environment(f"http://10.0.2.2:{port}") if port else "")

    def environment(self, vm: Vm) -> str:
        """What a command of `vm`'s is prefixed with: the egress proxy's address when
        its egress is an allowlist."""
        return self.egress_environment if proxied(vm.egress) else ""

    def run(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: float,
            out_cap: int) -> Collected:
        """Run `command` in the guest on a pooled connection; past `timeout_s`, kill it.
        Output is kept up to the caps (the rest is read and dropped); a step paramiko
        waits on past the deadline and the kill's wait gets the connection closed.
        A clock owed since a wake is set first (`clock_prefix`)."""
        with self._clocked(vm.id) as owed:
            return self._run(vm, (clock_prefix() if owed else "") + command, stdin,
                             timeout_s, out_cap)

    def clock_with_next_command(self, vm: Vm) -> None:
        """Leave the setting of the guest's clock to the next command run in it (the
        exec that woke it: a session of its own would cost the wake as much as the
        exec, QEMU translating the SSH server's session code anew; the warm-up that
        follows a wake by a request to an exposure); set it alone CLOCK_OWED_S from
        now if no command came by then."""
        self.conns.owe_clock(vm.id)

        def settle() -> None:
            time.sleep(CLOCK_OWED_S)
            with self.conns.lock:
                owed = vm.id in self.conns.clock_owed
            if owed:
                try:
                    self.run(vm, "true", None, HAND_OVER_S, 4096)  # carries the clock
                except GuestError as exc:
                    log.info("the clock of %s was not set: %s", vm.id, exc)

        threading.Thread(target=settle, daemon=True, name="rift-clock").start()

    @contextmanager
    def _clocked(self, vm_id: str) -> Iterator[bool]:
        """Whether `vm_id`'s next command is to set its clock, owed again when the
        command fails: it may not have reached the guest."""
        owed = self.conns.take_clock(vm_id)
        try:
            yield owed
        except BaseException:
            if owed:
                self.conns.owe_clock(vm_id)
            raise

    def _run(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: float,
             out_cap: int) -> Collected:
        where = address(vm)
        self.conns.remember(vm)
        self.warmer.settle(vm.id)
        guard: Guard | None = None
        try:
            with self.conns.pool.lease(vm.id, where, timeout_s) as transport:
                deadline = time.monotonic() + timeout_s
                with self.conns.watchdog.guard(deadline + KILL_WAIT_S + GRACE_S,
                                               transport.close) as guard:
                    collected = self.conns.session(transport, command, stdin, deadline, out_cap)
                    if collected.timed_out and collected.pid is not None:
                        # The timed-out channel is closed by now; the kill runs after it on
                        # the same connection (never two channels at once: rift.guest.pool).
                        killed = self.conns.session(transport, kill_line(collected.pid),
                                                    None, time.monotonic() + KILL_WAIT_S,
                                                    4096)
                        if killed.timed_out:
                            log.warning("could not kill a timed-out command in %s", vm.id)
        except FAILURES as exc:
            if guard is not None and guard.fired:
                raise GuestError(f"the guest did not answer within {timeout_s:.0f}s; its "
                                 "connection was closed", vm_id=vm.id) from exc
            raise GuestError(f"the SSH session to the guest failed: {exc}", vm_id=vm.id) from exc
        return collected

    def helper(self, vm: Vm, call: HelperCall) -> tuple[int | None, bytes]:
        """Run one rift-exec command on a pooled connection: (its exit status, what
        it printed, at most `call.limit` bytes). Each ends soon: `start` and `read`
        once their wait is over (an exec's keeper is a process of its own)."""
        status, data = self._helper_clocked(vm, call)
        if status == NOT_FOUND and self.helper_binary is not None:
            # A guest Rift did not build (a qcow2 image) has no rift-exec: give it one.
            self.upload_helper(vm)
            status, data = self._helper_clocked(vm, call)
        return status, data

    def _helper_clocked(self, vm: Vm, call: HelperCall) -> tuple[int | None, bytes]:
        """`call`, setting the guest's clock first when it is owed: by the helper
        itself when the call can (`call.clocked`; after a wake, a `date -s` is one
        more program QEMU translates anew), else by `date -s` before it."""
        with self._clocked(vm.id) as owed:
            if not owed:
                return self._helper_once(vm, call)
            if call.clocked is None:
                return self._helper_once(vm, replace(call, line=clock_prefix() + call.line))
            status, data = self._helper_once(vm, replace(
                call, line=call.clocked(round(time.time() * 100)), also=(*call.also, USAGE)))
            if status == USAGE and not data:  # a helper older than --clock (an older image)
                return self._helper_once(vm, replace(call, line=clock_prefix() + call.line))
            if status != 0:  # the helper did not start: the next command sets the clock
                self.conns.owe_clock(vm.id)
            return status, data

    def upload_helper(self, vm: Vm) -> None:
        assert self.helper_binary is not None
        self.put_binary(vm, self.helper_binary, GUEST_PATH)

    def put_binary(self, vm: Vm, binary: Callable[[], Path], path: str) -> None:
        """Put the program `binary` makes (a host file) into the guest at `path`."""
        name = path.rsplit("/", 1)[1]
        try:
            data = binary().read_bytes()
        except (ImageError, OSError) as exc:
            raise GuestError(f"the guest has no {name} and none is at hand: {exc}",
                             vm_id=vm.id) from exc
        folder = path.rsplit("/", 1)[0]
        aside = f"{path}.new.$$"  # calls racing to put it there each write their own
        script = (f"mkdir -p {folder} && cat > {aside} && chmod 755 {aside} "
                  f"&& mv -f {aside} {path}")
        collected = self.run(vm, script, data, self.conns.settings.file_timeout_s, 4096)
        if collected.exit_code != 0:
            raise GuestError(f"could not put {name} into the guest: " + collected.stderr
                             .decode("utf-8", "replace").strip()[-200:], vm_id=vm.id)
        log.info("%s put into guest %s", name, vm.id)

    def _helper_once(self, vm: Vm, call: HelperCall) -> tuple[int | None, bytes]:
        """What the guest answers is hostile (SPEC §15): read until `limit` bytes
        (more is GuestError), every step by the deadline, the connection closed by
        the watchdog when paramiko waits past it."""
        line, stdin, timeout_s, limit = call.line, call.stdin, call.timeout_s, call.limit
        where = address(vm)
        self.conns.remember(vm)
        self.warmer.settle(vm.id)
        deadline = time.monotonic() + timeout_s
        guard: Guard | None = None
        try:
            with self.conns.pool.lease(vm.id, where, timeout_s) as transport, \
                    self.conns.watchdog.guard(deadline + GRACE_S, transport.close) as guard:
                chan = transport.open_session(
                    timeout=left(deadline, self.conns.settings.connect_timeout_s))
                try:
                    chan.exec_command(line)
                    if stdin:
                        send_within(chan, stdin, deadline)
                    chan.shutdown_write()
                    data = read_capped(chan, deadline, limit, vm.id)
                    if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
                        raise GuestError("rift-exec did not end", vm_id=vm.id)
                    status = chan.recv_exit_status()
                    err = chan.recv_stderr(4096) if chan.recv_stderr_ready() else b""
                finally:
                    chan.close()
        except TimeoutError as exc:
            raise GuestError(f"rift-exec did not answer within {timeout_s:.0f}s: {exc}",
                             vm_id=vm.id) from exc
        except FAILURES as exc:
            if guard is not None and guard.fired:
                raise GuestError(f"rift-exec did not answer within {timeout_s:.0f}s; its "
                                 "connection was closed", vm_id=vm.id) from exc
            raise GuestError(f"the SSH session to the guest failed: {exc}", vm_id=vm.id) from exc
        if call.view and status not in (0, NO_SUCH_EXEC, NOT_FOUND, *call.also):
            raise GuestError(f"rift-exec failed (exit {status})"
                             f"{': ' + repr(err[-200:]) if err else ''}", vm_id=vm.id)
        return status, data

