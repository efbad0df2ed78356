"""A guest's connection through its VM's life: the boot wait, a pooled guest's
standby shell and hand-over, the login after a restore or a resume, and a fork's
new identity. Each step is bounded: by the boot wait, by HAND_OVER_S, or by the
watchdog past its deadline."""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path

from rift.domain.model import Vm
from rift.guest.connections import FAILURES, GRACE_S, HAND_OVER_S
from rift.guest.console import ConsoleKeeper
from rift.guest.errors import GuestError
from rift.guest.keys import keep_boot_key, key_path, load_key, public_line
from rift.guest.ready import serial_tail, wait_for_marker
from rift.guest.run import Collected, send_within
from rift.guest.runner import Runner
from rift.guest.scripts import (
    HAND_OVER_FUNCTION,
    OLD_HELPER,
    RESTART_S,
    STANDBY_SHELL,
    hand_over_call,
    hand_over_script,
    identity_script,
    in_standby,
    same_host_key_script,
)
from rift.guest.steps import address, left
from rift.guest.trust import GuestTrust
from rift.guest.warm import WARM_S, WARM_UP_LINE, WARMED

log = logging.getLogger("rift.guest.shell")

_LOGIN_RETRY_S = 0.5  # between SSH logins to a guest that prints no ready marker


class ShellLife:
    """Boot waits, hand-overs, logins after restores, forks' identities. `keeper`
    keeps the serial logs under their cap from the first boot wait on; `trust`
    gives guests the operator's certificate authorities."""

    def __init__(self, runner: Runner, keeper: ConsoleKeeper | None = None,
                 trust: GuestTrust | None = None) -> None:
        self.runner = runner
        self.conns = runner.conns
        self.keeper = keeper
        self.trust = trust or GuestTrust(runner, None)

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
        Then the guest is given RIFT_GUEST_CA_FILE's certificates (rift.guest.trust).
        """
        deadline = time.monotonic() + timeout_s
        if self.keeper is not None:
            self.keeper.start()
        with self.conns.lock:
            self.conns.closed.discard(vm.id)  # a boot under this id starts now
            if markers:
                self.conns.serial[vm.id] = serial_log

        def gone() -> bool:
            with self.conns.lock:
                return vm.id in self.conns.closed

        self.conns.remember(vm)
        console = self.conns.routes.console(vm.id, serial_log)
        if markers:
            host_key = wait_for_marker(console, deadline, gone=gone)
            if host_key is not None:
                self.conns.pin_host_key(vm.id, host_key)
        where = address(vm)
        connect_timeout_s = self.conns.settings.connect_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                transport = self.conns.connect(vm.id, where, timeout_s=None if markers else
                                               max(1.0, min(connect_timeout_s, remaining)))
            except GuestError as exc:
                if not markers:
                    with self.conns.lock:
                        self.conns.host_keys.pop(vm.id, None)
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
            self.conns.pool.add(vm.id, where, transport)
            self.trust.install(vm)
            return

    def standby(self, vm: Vm) -> None:
        """Open, on a connection of its own, a shell in the pooled guest `vm` that
        waits for the hand-over's lines: the hand-over then starts no process in
        the guest (each costs tens of milliseconds under TCG). Replaces one open
        before; GuestError when the guest does not take it. The guest is warmed up
        first (rift.guest.warm): the hand-out's first exec then costs what the
        next one does."""
        where = address(vm)
        self.conns.remember(vm)
        self.runner.warmer.warm(vm)
        transport = self.conns.connect(vm.id, where)
        deadline = time.monotonic() + HAND_OVER_S
        try:
            with self.conns.watchdog.guard(deadline + GRACE_S, transport.close):
                chan = transport.open_session(
                    timeout=left(deadline, self.conns.settings.connect_timeout_s))
                chan.exec_command(STANDBY_SHELL)
                send_within(chan, f"{HAND_OVER_FUNCTION}\n".encode(), deadline)
                # A rehearsal with the key the guest has now: a first run pays what a
                # guest pays for code and files nothing has touched since its boot
                # (about 100 ms under TCG), so the real hand-over does not.
                status = in_standby(chan, hand_over_call(self._login_key_line(vm),
                                                         time.time(), secrets.token_bytes(32)),
                                    deadline)
        except (*FAILURES, TimeoutError) as exc:
            transport.close()
            raise GuestError(f"the standby shell did not start: {exc}", vm_id=vm.id) from exc
        if status != 0:
            transport.close()
            raise GuestError(f"the standby shell's rehearsal failed (exit {status})",
                             vm_id=vm.id)
        with self.conns.lock:
            old = self.conns.standby.pop(vm.id, None)
            self.conns.standby[vm.id] = (transport, chan)
        if old is not None:
            old[0].close()

    def _login_key_line(self, vm: Vm) -> str:
        """The public key line the VM's root accepts now (its task's, or its pool's)."""
        with self.conns.lock:
            task_id = self.conns.task_of.get(vm.id, vm.task_id)
        return public_line(load_key(key_path(self.conns.keys_dir, task_id)))

    def hand_over(self, vm: Vm, public_key_line: str, task_id: str, now: float) -> None:
        """Run, on the pooled guest `vm` (its `task_id` names the pool key), the
        hand-over: root's authorized key becomes `public_key_line`, its clock `now`
        (where it is more than a second off), and 32 random bytes of this host go
        into the guest's entropy pool. It runs in the standby shell when one is
        open (whose connection then serves the VM's calls), else on a pooled
        connection. From then on the VM's connections log in with `task_id`'s key.

        The pool key stays on this host as the VM's boot key (a file named by the
        VM id): a reboot inside the guest brings it back from the kernel command
        line, and the next login then hands the VM over again (see Connections.connect)."""
        keep_boot_key(self.conns.keys_dir, vm.task_id, vm.id)
        entropy = secrets.token_bytes(32)
        with self.conns.lock:
            held = self.conns.standby.pop(vm.id, None)
        if held is not None:
            transport, chan = held
            deadline = time.monotonic() + HAND_OVER_S
            try:
                with self.conns.watchdog.guard(deadline + GRACE_S, transport.close):
                    status = in_standby(chan, hand_over_call(public_key_line, now, entropy),
                                        deadline)
            except (*FAILURES, TimeoutError) as exc:
                log.info("standby shell of %s failed (%s); handing over anew", vm.id, exc)
                status = None
            chan.close()
            if status == 0:
                with self.conns.lock:
                    self.conns.task_of[vm.id] = task_id
                self.conns.pool.add(vm.id, address(vm), transport)
                self.trust.ensure(vm)  # a pooled VM from before this process
                return
            transport.close()
            if status is not None:
                raise GuestError(f"the hand-over failed (exit {status})", vm_id=vm.id)
        collected = self.runner.run(vm, hand_over_script(public_key_line, now, entropy),
                                    None, HAND_OVER_S, 4096)
        if collected.exit_code != 0:
            reason = collected.stderr.decode("utf-8", "replace").strip()
            raise GuestError(f"the hand-over failed (exit {collected.exit_code}): {reason}",
                             vm_id=vm.id)
        with self.conns.lock:
            self.conns.task_of[vm.id] = task_id
        self.trust.ensure(vm)
        # no standby shell: a restored guest, whose QEMU translated nothing of the
        # exec helper yet; warmed up after the answer (rift.guest.warm)
        self.runner.warmer.warm_later(vm)

    def reconnect(self, vm: Vm, host_key: str | None, timeout_s: float, *,
                  tunnel: bool = False) -> None:
        """Drop the VM's connections (a restore cut them), pin `host_key`, and log in
        again and again until one succeeds or `timeout_s` passes (GuestError). The
        connection is pooled, or with `tunnel` the one that carries the VM's
        exposures' channels (a request to one waits for it)."""
        self.conns.pool.close_vm(vm.id)
        if host_key is not None:
            self.conns.pin_host_key(vm.id, host_key)
        self.conns.remember(vm)
        where = address(vm)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                transport = self.conns.connect(vm.id, where, timeout_s=max(1.0, min(
                    self.conns.settings.connect_timeout_s, deadline - time.monotonic())))
            except GuestError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
                continue
            if tunnel:
                self.conns.keep_tunnel(vm.id, transport)
            else:
                self.conns.pool.add(vm.id, where, transport)
            return

    def drop_connections(self, vm_id: str) -> None:
        """Close the VM's connections (calls in flight fail), keeping its host key
        pinned and its task known: a pause is about to cut them."""
        self.conns.drop(vm_id)

    def set_clock_and_warm(self, vm: Vm, now: float) -> bool:
        """Set the guest's clock to `now` (a restore brings back the clock it was
        saved with) and, in the same session, warm it up (rift.guest.warm): the
        restore's QEMU translated nothing yet, so the call that comes next (the
        one that woke the VM) costs what the one after does. One session, not
        two: the first after a restore pays for the SSH server's own code too.
        Answers whether it warmed up: a warm-up that fails (a guest without the
        helper) leaves the clock set and the call going on."""
        line = f'date -s "@{round(now)}" >/dev/null && {{ {WARM_UP_LINE}; }}'
        collected = self.runner.run(vm, line, None, HAND_OVER_S + WARM_S, 4096)
        if collected.exit_code != 0:
            reason = collected.stderr.decode("utf-8", "replace").strip()
            raise GuestError(f"setting the clock failed (exit {collected.exit_code}): "
                             f"{reason}", vm_id=vm.id)
        return WARMED.encode() in collected.stdout

    def refresh_identity(self, vm: Vm, mac: str, *, keep_host_key: bool = False) -> str:
        """Give a fork (a guest restored from another's saved state) an identity of
        its own: a new SSH host key (its SSH server started anew with it; this
        connection stays), the MAC `mac` on its network interface (in Rift's own
        images: a cloud image's network configuration matches its MAC), fresh
        bytes of this host mixed into its entropy pool and its random number
        generator reseeded from it, and this host's clock (`rift-exec identity`).
        Pins and answers the new host key line. With `keep_host_key` the host key
        and the SSH server stay as they are: answers ""."""
        make = same_host_key_script if keep_host_key else identity_script

        def once() -> Collected:
            script = make(mac, secrets.token_bytes(32), time.time())
            return self.runner.run(vm, script, None, HAND_OVER_S * 4, 4096)

        collected = once()
        if collected.exit_code in OLD_HELPER and self.runner.helper_binary is not None:
            self.runner.upload_helper(vm)  # a guest with an older rift-exec, or none: again
            collected = once()
        status = collected.exit_code
        if status != 0:
            reason = collected.stderr.decode("utf-8", "replace").strip()[-300:]
            raise GuestError(f"the fork's new identity failed (exit {status}): {reason}",
                             vm_id=vm.id)
        if keep_host_key:
            return ""
        lines = collected.stdout.decode("utf-8", "replace").split("\n")
        key_line = next((line for line in reversed(lines) if line.startswith("ssh-")), None)
        if key_line is None:
            raise GuestError("the fork's new host key was not printed", vm_id=vm.id)
        self.conns.pin_host_key(vm.id, key_line.strip())
        with self.conns.lock:
            self.conns.restarting[vm.id] = time.monotonic() + RESTART_S
        return key_line.strip()

