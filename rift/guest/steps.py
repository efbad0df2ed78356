"""Bounded steps on one SSH channel, and the checks every call starts with: each
step ends by its deadline, and a reply is read up to a limit (SPEC §15)."""

from __future__ import annotations

import contextlib
import select
import time

import paramiko

from rift.domain.model import Vm
from rift.guest.errors import GuestError, GuestFileError


def left(deadline: float, at_most: float) -> float:
    """The time a step may take: what is left until `deadline`, at most `at_most`
    (and a little, so that a step past the deadline fails rather than not start)."""
    return max(0.01, min(at_most, deadline - time.monotonic()))


def read_capped(chan: paramiko.Channel, deadline: float, limit: int, vm_id: str) -> bytes:
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


def wait(chan: paramiko.Channel, seconds: float) -> None:
    if chan.eof_received:
        # After EOF the channel's pipe stays readable: wait for the exit status instead.
        chan.status_event.wait(seconds)
        return
    with contextlib.suppress(ValueError, OSError):
        select.select([chan], [], [], seconds)


def address(vm: Vm) -> tuple[str, int]:
    if vm.ssh_host is None or vm.ssh_port is None:
        raise GuestError(f"VM {vm.id} has no SSH address", vm_id=vm.id)
    return vm.ssh_host, vm.ssh_port


def absolute(path: str, vm: Vm) -> None:
    if not path.startswith("/"):
        raise GuestFileError(path, "the path must be absolute", vm_id=vm.id)
