"""SSH connections kept open per VM, each lent to one call at a time.

dropbear loses exit statuses and closes the wrong channels when one
connection carries several channels at once, so a connection runs one channel
at a time, and concurrent calls to one VM get connections of their own (up to
`per_vm`; a further call waits for one to come back). Idle connections are
kept (up to `keep_idle`) for the next call; dead ones are dropped and replaced.
`close_vm` closes every connection of a VM, so calls in flight end at once.

Generic over the transport (anything with `is_active()` and `close()`), so
tests use fakes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from rift.guest.errors import GuestError


class Transport(Protocol):
    def is_active(self) -> bool: ...
    def close(self) -> None: ...


T = TypeVar("T", bound=Transport)
Address = tuple[str, int]


@dataclass
class _Slot(Generic[T]):
    address: Address
    idle: list[T] = field(default_factory=list)
    open: list[T] = field(default_factory=list)  # idle and lent
    opening: int = 0
    closed: bool = False


class ConnectionPool(Generic[T]):
    """Connections by VM id; `connect(vm_id, address)` opens one (raising GuestError)."""

    def __init__(self, connect: Callable[[str, Address], T], *, per_vm: int = 4,
                 keep_idle: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        self._connect = connect
        self.per_vm = per_vm
        self.keep_idle = keep_idle
        self._clock = clock
        self._cond = threading.Condition()
        self._slots: dict[str, _Slot[T]] = {}

    @contextmanager
    def lease(self, vm_id: str, address: Address, wait_s: float) -> Iterator[T]:
        """A connection for this caller alone; dropped if the block raises."""
        transport = self._acquire(vm_id, address, self._clock() + wait_s)
        healthy = False
        try:
            yield transport
            healthy = True
        finally:
            self._release(vm_id, transport, healthy)

    def add(self, vm_id: str, address: Address, transport: T) -> None:
        """Keep an opened connection as idle (closed instead when there is no room)."""
        retired: list[T] = []
        try:
            with self._cond:
                slot = self._slot(vm_id, address, retired)
                if (len(slot.open) + slot.opening < self.per_vm
                        and len(slot.idle) < self.keep_idle):
                    slot.open.append(transport)
                    slot.idle.append(transport)
                    self._cond.notify_all()
                    return
            retired.append(transport)
        finally:
            for old in retired:
                old.close()

    def count(self, vm_id: str) -> int:
        """Open connections of a VM (idle and lent)."""
        with self._cond:
            slot = self._slots.get(vm_id)
            return 0 if slot is None else len(slot.open)

    def close_vm(self, vm_id: str) -> None:
        with self._cond:
            slot = self._slots.pop(vm_id, None)
            if slot is not None:
                slot.closed = True
            self._cond.notify_all()
        if slot is not None:
            for transport in slot.open:
                transport.close()

    def close(self) -> None:
        with self._cond:
            vm_ids = list(self._slots)
        for vm_id in vm_ids:
            self.close_vm(vm_id)

    def _slot(self, vm_id: str, address: Address, retired: list[T]) -> _Slot[T]:
        """The VM's slot, replaced when the VM's address changed (called locked); the
        old slot's connections go into `retired`, for closing once unlocked (a close
        may wait on the network: nothing does while the pool's lock is held)."""
        slot = self._slots.get(vm_id)
        if slot is not None and slot.address != address:
            slot.closed = True
            retired.extend(slot.open)
            slot = None
        if slot is None:
            slot = self._slots[vm_id] = _Slot(address)
        return slot

    def _acquire(self, vm_id: str, address: Address, deadline: float) -> T:
        retired: list[T] = []
        try:
            with self._cond:
                while True:
                    slot = self._slot(vm_id, address, retired)
                    while slot.idle:
                        transport = slot.idle.pop()
                        if transport.is_active():
                            return transport
                        slot.open.remove(transport)
                        retired.append(transport)
                    if len(slot.open) + slot.opening < self.per_vm:
                        slot.opening += 1
                        break
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        raise GuestError(f"all {self.per_vm} connections to the guest are "
                                         "busy", vm_id=vm_id)
                    self._cond.wait(remaining)
        finally:
            for old in retired:
                old.close()
        try:
            transport = self._connect(vm_id, address)
        except BaseException:
            with self._cond:
                slot.opening -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            slot.opening -= 1
            if not slot.closed:
                slot.open.append(transport)
                return transport
        transport.close()
        raise GuestError("the VM was closed while connecting to it", vm_id=vm_id)

    def _release(self, vm_id: str, transport: T, healthy: bool) -> None:
        with self._cond:
            slot = self._slots.get(vm_id)
            keep = False
            if slot is not None and transport in slot.open:
                if healthy and transport.is_active() and len(slot.idle) < self.keep_idle:
                    slot.idle.append(transport)
                    keep = True
                else:
                    slot.open.remove(transport)
            self._cond.notify_all()
        if not keep:
            transport.close()
