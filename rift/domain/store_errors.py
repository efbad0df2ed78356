"""What the store says when a write cannot be made as asked.

These are store facts, not refusals: the services catch them and decide what
they mean (a reused idempotency key is answered with the first result). They
live in the domain so that the engine can catch them without importing the
store, and the store can raise them without importing the engine.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of the store's own errors."""


class DuplicateKey(StoreError):
    """An insert hit a unique key that another row already holds.

    ``table`` and ``field`` name the key, e.g. ``("tasks", "idempotency_key")``.
    The transaction stays usable: the services may read the row that won.
    """

    def __init__(self, table: str, field: str) -> None:
        super().__init__(f"{table}.{field} is already taken")
        self.table = table
        self.field = field


class MissingReference(StoreError):
    """An insert named a parent row that does not exist (a VM of no task)."""

    def __init__(self, table: str, field: str) -> None:
        super().__init__(f"{table}.{field} names no existing row")
        self.table = table
        self.field = field


class ReadOnlyTransaction(StoreError):
    """A change was attempted inside ``store.read()``; use ``store.write()``."""

    def __init__(self, method: str) -> None:
        super().__init__(f"{method} changes the store: call it inside store.write()")
        self.method = method
