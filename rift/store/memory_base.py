"""What every part of the in-memory transaction shares: the state, the
read-only guard, and times kept in UTC."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from rift.domain.store_errors import ReadOnlyTransaction
from rift.store.changes import utc

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from rift.store.memory import MemoryState

V = TypeVar("V", bound="DataclassInstance")


def utc_values(value: V) -> V:
    """The value with every datetime field checked and moved to UTC."""
    moved = {
        f.name: utc(getattr(value, f.name))
        for f in dataclasses.fields(value)
        if isinstance(getattr(value, f.name), datetime)
    }
    return dataclasses.replace(value, **moved)


def utc_changes(changes: dict[str, Any]) -> dict[str, Any]:
    return {k: utc(v) if isinstance(v, datetime) else v for k, v in changes.items()}


def json_copy(details: dict[str, Any]) -> dict[str, Any]:
    # What a JSON column would give back: fails on what it could not store.
    copied: dict[str, Any] = json.loads(json.dumps(details))
    return copied


class MemoryTxBase:
    """One block over a ``MemoryState``: the live one in ``read()``, a draft in ``write()``."""

    def __init__(self, state: MemoryState, *, writable: bool) -> None:
        self._s = state
        self._writable = writable

    def _writing(self, method: str) -> None:
        if not self._writable:
            raise ReadOnlyTransaction(method)

    def _next_seq(self) -> int:
        self._s.last_seq += 1
        return self._s.last_seq
