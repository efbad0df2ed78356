"""A column type for timezone-aware UTC times on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from rift.store.changes import utc

# "2026-01-01T12:00:00.000000+00:00": always this width, so text order is time order.
SQLITE_WIDTH = 32


class UtcDateTime(TypeDecorator[datetime]):
    """``timestamptz`` on PostgreSQL; a fixed-width ISO-8601 string on SQLite.

    Takes aware datetimes only (a naive one is a bug: ``ValueError``) and gives
    back aware UTC datetimes with their microseconds on both.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(SQLITE_WIDTH))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        value = utc(value)
        if dialect.name == "sqlite":
            return value.isoformat(timespec="microseconds")
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if not isinstance(value, datetime):
            raise TypeError(f"not a time: {value!r}")
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
