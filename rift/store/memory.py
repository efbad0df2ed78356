"""The in-memory store: the fake beside ``SqlStore`` for the engine's unit tests.

One ``threading.RLock`` is held for the whole of every ``read()`` and
``write()`` block, so blocks run one at a time. A write works on a copy of the
state and puts it in place only when the block ends without an exception: a
use case that fails half-way leaves nothing behind, as a rolled-back database
transaction would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rift.domain.model import ApiToken, Event, Host, Task, User, Vm
from rift.domain.records import LoginFailures, WebSession
from rift.store.memory_tx import MemoryTx


@dataclass
class MemoryState:
    """Every row. Values are frozen dataclasses, so a copy of the dicts is a
    snapshot; ``seq`` numbers keep insertion order like the SQL ``seq`` columns."""

    users: dict[str, User] = field(default_factory=dict)
    tokens: dict[str, ApiToken] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    task_seq: dict[str, int] = field(default_factory=dict)
    vms: dict[str, Vm] = field(default_factory=dict)
    vm_seq: dict[str, int] = field(default_factory=dict)
    events: dict[int, Event] = field(default_factory=dict)
    hosts: dict[str, Host] = field(default_factory=dict)
    sessions: dict[str, WebSession] = field(default_factory=dict)
    login_failures: dict[str, LoginFailures] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=lambda: {"install_id": "rift_memory"})
    last_seq: int = 0
    last_event_id: int = 0

    def copy(self) -> MemoryState:
        return MemoryState(
            users=dict(self.users),
            tokens=dict(self.tokens),
            tasks=dict(self.tasks),
            task_seq=dict(self.task_seq),
            vms=dict(self.vms),
            vm_seq=dict(self.vm_seq),
            events=dict(self.events),
            hosts=dict(self.hosts),
            sessions=dict(self.sessions),
            login_failures=dict(self.login_failures),
            meta=dict(self.meta),
            last_seq=self.last_seq,
            last_event_id=self.last_event_id,
        )


class MemoryStore:
    """Implements the engine's ``Store`` port in memory, with SqlStore's semantics."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._state = MemoryState()
        self._writer: int | None = None

    @contextmanager
    def read(self) -> Iterator[MemoryTx]:
        with self._lock:
            yield MemoryTx(self._state, writable=False)

    @contextmanager
    def write(self) -> Iterator[MemoryTx]:
        with self._lock:
            me = threading.get_ident()
            if self._writer == me:
                # On SQLite this would wait on its own write lock until busy_timeout.
                raise RuntimeError("store.write() inside store.write() in one thread")
            self._writer = me
            try:
                draft = self._state.copy()
                yield MemoryTx(draft, writable=True)
                self._state = draft
            finally:
                self._writer = None

    def close(self) -> None:
        """Nothing to release; the rows stay readable."""
