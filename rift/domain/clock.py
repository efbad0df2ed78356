"""The clock port: every rule about time takes `now` from here."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock tests move by hand; it never sleeps."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


def iso(at: datetime | None) -> str | None:
    """ISO-8601 in UTC with a `Z`, to the second's fraction the store keeps."""
    if at is None:
        return None
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")
