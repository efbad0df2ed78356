"""The warm-up that makes a guest's first exec cost what the next one does.

Under TCG the first `rift-exec start` in a guest's life pays for QEMU translating
the helper's code, its keeper's fork and the command's shell, about as much
again as the exec itself; after a restore (a saved pool's hand-out, a fork) it
pays it again, as the new QEMU process translated nothing yet. The warm-up runs
one `rift-exec start` of `true` (in a folder of its own, removed after) on the
connection the start left open: at a pool's fill, before its standby shell
waits (the hand-out then finds the guest warm), right after a restore's or
a fork's answer, in the background (a call to that VM meanwhile waits for the
warm-up to end, at most WARM_S, rather than pay for a new SSH login beside it),
and after the login that follows a wake, a resume or a snapshot, in the session
that sets the guest's clock, before the call that woke it goes on
(rift.guest.life.ShellLife.set_clock_and_warm); a wake by a request to an
exposure leaves the guest to that request, which no helper serves (a session
beside it, on a login of its own, took the one vCPU of a just-restored `debian`
from it), and sets the clock in the warm-up WARM_AFTER_S later, unless a
command came first and set it.
A guest without the helper (a qcow2 image) is left as it is. Everything here is
bounded: the session by WARM_S, the connection by the watchdog past it.
"""

from __future__ import annotations

import logging
import threading
import time

from hypervisor.exec_helper import GUEST_PATH
from rift.domain.model import Vm
from rift.guest.connections import FAILURES, GRACE_S, Connections
from rift.guest.errors import GuestError
from rift.guest.exec_view import EXECS_DIR
from rift.guest.scripts import clock_prefix
from rift.guest.steps import address

log = logging.getLogger("rift.guest.shell")

WARM_S = 10.0  # the warm-up's session; a call waits no longer for it
# a wake by a request to an exposure: the warm-up, which sets the clock, comes this long
# after, once the guest's server has answered, for the exec that may follow
WARM_AFTER_S = 1.0
# `true` under the helper as an exec runs it (its keeper, its shell, an exec's default
# ring of 16 MiB and answer of 1 MiB, its view sent down the channel: a first exec after
# a warm-up with a small ring and its view to /dev/null still paid some 5-10 ms on
# `tiny`), WARMED printed when it did, then its folder removed; `$$`, the login shell's
# pid, keeps racing warm-ups apart
_FOLDER = f"{EXECS_DIR}/warm-up-$$"
WARMED = "warmed"
WARM_UP_LINE = (f"[ -x {GUEST_PATH} ] || exit 0; {GUEST_PATH} start {_FOLDER} 5 {16 << 20} "
                f"{int(WARM_S * 500)} {1 << 20} -- true && echo {WARMED}; rm -rf {_FOLDER}")


class Warmer:
    """Warm-ups of guests, and the calls' wait for one in flight."""

    def __init__(self, conns: Connections) -> None:
        self.conns = conns
        self.lock = threading.Lock()
        self.warming: dict[str, threading.Event] = {}  # vm id -> set when its warm-up ends

    def warm(self, vm: Vm) -> float | None:
        """Run the warm-up now on a pooled connection, the guest's clock set first when
        it is owed: its seconds, None when it failed (logged; the first exec then pays
        what it would have, the clock still owed)."""
        began = time.monotonic()
        deadline = began + WARM_S
        owed = self.conns.take_clock(vm.id)
        try:
            with self.conns.pool.lease(vm.id, address(vm), WARM_S) as transport, \
                    self.conns.watchdog.guard(deadline + GRACE_S, transport.close):
                line = (clock_prefix() if owed else "") + WARM_UP_LINE  # after the login
                collected = self.conns.session(transport, line, None, deadline, 4096)
        except (*FAILURES, GuestError) as exc:
            if owed:
                self.conns.owe_clock(vm.id)
            log.info("warm-up of %s failed: %s", vm.id, exc)
            return None
        if collected.exit_code != 0:
            log.info("warm-up of %s exited %s", vm.id, collected.exit_code)
            return None
        return time.monotonic() - began

    def warm_later(self, vm: Vm, after_s: float = 0.0) -> None:
        """Warm `vm` up in the background, `after_s` from now; its calls wait for it
        once it has begun (`settle`), not before."""
        done = threading.Event()
        if not after_s:
            with self.lock:
                self.warming[vm.id] = done

        def run() -> None:
            if after_s:
                time.sleep(after_s)  # what the call that woke it does goes first
                with self.lock:
                    self.warming[vm.id] = done
            try:
                took = self.warm(vm)
                if took is not None:
                    log.info("guest %s warmed up in %.0f ms", vm.id, took * 1000)
            finally:
                with self.lock:
                    if self.warming.get(vm.id) is done:
                        del self.warming[vm.id]
                done.set()

        threading.Thread(target=run, daemon=True, name="rift-warm-up").start()

    def settle(self, vm_id: str) -> None:
        """Wait for `vm_id`'s warm-up in flight to end, at most WARM_S + GRACE_S."""
        with self.lock:
            done = self.warming.get(vm_id)
        if done is not None:
            done.wait(WARM_S + GRACE_S)
