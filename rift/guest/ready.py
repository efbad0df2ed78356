"""Waiting for a new guest: its init's marker on the serial log.

Connecting before the guest's network is up hangs, so the serial log (a file
QEMU writes) is watched first. The markers are those `hypervisor/guest_init.sh`
prints (hypervisor.kernel_boot names them); other images may print none, and
then only an SSH login counts (SshGuestShell.connect_when_ready).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import paramiko

from hypervisor.kernel_boot import FAILED_MARKER, HOSTKEY_MARKER, READY_MARKER
from rift.guest.console import TAIL_BYTES, read_tail
from rift.guest.errors import GuestError

_POLL_S = 0.02
_TAIL = 400


# A serial console: the file QEMU writes here, or what reads its tail on the VM's
# host (a callable answering its last TAIL_BYTES, None while there is none).
Console = Path | Callable[[], bytes | None]
_REMOTE_POLL_S = 0.2  # a console read over SSH costs a round trip


def _tail(console: Console) -> bytes | None:
    """The console's last TAIL_BYTES: a log a guest floods is never read whole."""
    if callable(console):
        return console()
    return read_tail(console, TAIL_BYTES)


def read_markers(serial_log: Console) -> tuple[bool, str | None, str | None]:
    """(ready, host key line or None, failure reason or None) from the log's tail
    (the markers are the init's last lines; what a guest prints after them in
    more than TAIL_BYTES hides them, which costs that guest its own boot)."""
    data = _tail(serial_log)
    if data is None:
        return False, None, None
    ready = False
    host_key: str | None = None
    failed: str | None = None
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.strip("\r\x00 ")
        if line == READY_MARKER:
            ready = True
        elif line.startswith(HOSTKEY_MARKER + " "):
            host_key = line.removeprefix(HOSTKEY_MARKER + " ").strip()[:1024] or None
        elif line.startswith(FAILED_MARKER):
            failed = (line.removeprefix(FAILED_MARKER).strip()[:300]
                      or "the guest's init failed")
    return ready, host_key, failed


def serial_tail(serial_log: Console) -> str:
    try:
        data = _tail(serial_log)
    except OSError:
        return ""
    return (data or b"")[-_TAIL:].decode("utf-8", "replace").strip()


def wait_for_marker(serial_log: Console, deadline: float, *,
                    clock: Callable[[], float] = time.monotonic,
                    gone: Callable[[], bool] = lambda: False) -> str | None:
    """Block until the ready marker; answer the host key line it printed (or None).

    GuestError when init reports a failure, `gone()` says the VM was put away, or
    `deadline` (a `clock()` time) passes.
    """
    while True:
        ready, host_key, failed = read_markers(serial_log)
        if failed is not None:
            raise GuestError(f"the guest's init failed: {failed}")
        if ready:
            return host_key
        if gone():
            raise GuestError("the VM was destroyed while it booted")
        if clock() >= deadline:
            tail = serial_tail(serial_log)
            raise GuestError(f"no {READY_MARKER} on the serial console"
                             + (f"; it ends with: {tail!r}" if tail else " (it is empty)"))
        time.sleep(_REMOTE_POLL_S if callable(serial_log) else _POLL_S)


def same_key(key: paramiko.PKey, line: str) -> bool:
    """Whether `key` is the one in an OpenSSH public key line (`type base64 [comment]`)."""
    fields = line.split()
    return fields[:2] == [key.get_name(), key.get_base64()]
