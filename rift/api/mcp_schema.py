"""Input fields with their SPEC §3 ranges, the JSON schemas built from them, and
the one check of a tool's arguments against them.

The check and the published `inputSchema` come from the same `Field`s, so what
a client reads is what the server enforces. Rift checks arguments itself rather
than letting the SDK do it: an unknown field, a wrong type or a value out of
range must be Rift's `invalid_argument` refusal naming the field (a tool result
with `isError`), not a JSON-RPC error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from rift.domain.errors import InvalidArgument

Kind = Literal["string", "integer", "boolean"]

MAX_TEXT = 200
MAX_COMMAND = 64 * 1024
MAX_CONTENT = 16 * 1024 * 1024
MAX_CONTENT_BASE64 = math.ceil(MAX_CONTENT / 3) * 4  # 16 MiB of data, base64-encoded
MAX_PATH = 4096
_FIELD_SHOWN = 64  # how much of an unknown field's name a refusal repeats


@dataclass(frozen=True)
class Field:
    """One input field: its JSON type, range and description."""

    kind: Kind
    description: str
    low: int | None = None  # minLength for strings, minimum for integers
    high: int | None = None  # maxLength for strings, maximum for integers
    enum: tuple[str, ...] | None = None
    pattern: str | None = None  # the whole value must match
    pattern_why: str = ""
    default: str | int | bool | None = None

    @cached_property
    def _regex(self) -> re.Pattern[str] | None:
        return re.compile(self.pattern) if self.pattern else None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "description": self.description}
        lo, hi = ("minLength", "maxLength") if self.kind == "string" else ("minimum", "maximum")
        if self.low is not None:
            out[lo] = self.low
        if self.high is not None:
            out[hi] = self.high
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.pattern is not None:
            out["pattern"] = f"^{self.pattern}$"
        if self.default is not None:
            out["default"] = self.default
        return out

    def check(self, name: str, value: Any) -> Any:
        """The value, cleaned (an integral float becomes an int); else `InvalidArgument`."""
        if self.kind == "boolean":
            if not isinstance(value, bool):
                raise InvalidArgument(name, "must be true or false")
            return value
        if self.kind == "integer":
            return self._check_integer(name, value)
        if not isinstance(value, str):
            raise InvalidArgument(name, "must be a string")
        if self.enum is not None and value not in self.enum:
            raise InvalidArgument(name, f"must be one of {', '.join(self.enum)}")
        low = 0 if self.low is None else self.low
        if len(value) < low or (self.high is not None and len(value) > self.high):
            span = f"{low}–{self.high}" if self.high is not None else f"at least {low}"
            raise InvalidArgument(name, f"must be {span} characters, got {len(value)}")
        if self._regex is not None and not self._regex.fullmatch(value):
            raise InvalidArgument(name, self.pattern_why)
        return value

    def _check_integer(self, name: str, value: Any) -> int:
        # JSON has one number type: 5.0 is the integer 5 (as JSON Schema reads it).
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(name, "must be an integer")
        if (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high):
            low = "" if self.low is None else str(self.low)
            high = "" if self.high is None else str(self.high)
            shown = str(value) if abs(value) < 10**18 else "a number out of range"
            raise InvalidArgument(name, f"must be between {low} and {high}, got {shown}")
        return value


def input_schema(fields: Mapping[str, Field], required: tuple[str, ...]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {name: field.schema() for name, field in fields.items()},
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


def _shown(key: str) -> str:
    printable = "".join(c if c.isprintable() else "?" for c in key[:_FIELD_SHOWN])
    return printable + ("…" if len(key) > _FIELD_SHOWN else "")


def check_arguments(tool: str, fields: Mapping[str, Field], required: tuple[str, ...],
                    arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every field of the tool, checked (absent ones `None`), or `InvalidArgument`
    naming the first field at fault."""
    given = arguments or {}
    for key in given:
        if key not in fields:
            raise InvalidArgument(_shown(key), f"is not a field of {tool}; it takes "
                                  f"{', '.join(fields) or 'no fields'}")
    for key in required:
        if key not in given:
            raise InvalidArgument(key, "is required")
    return {name: (field.check(name, given[name]) if name in given else None)
            for name, field in fields.items()}


# -- output schemas -------------------------------------------------------------------

_STR: dict[str, Any] = {"type": "string"}
_NSTR: dict[str, Any] = {"type": ["string", "null"]}
_INT: dict[str, Any] = {"type": "integer"}
_BOOL: dict[str, Any] = {"type": "boolean"}


def obj(**properties: dict[str, Any]) -> dict[str, Any]:
    """An object schema whose every listed property is required."""
    return {"type": "object", "properties": properties, "required": list(properties)}


VM_VIEW = obj(
    id=_STR, task_id=_STR, name=_STR, image=_STR,
    status={"type": "string", "enum": ["creating", "running", "failed", "destroyed"]},
    host=_STR, vcpus=_INT, memory_mib=_INT,
    ssh={"type": ["object", "null"],
         "properties": {"host": _NSTR, "port": _INT}, "required": ["host", "port"]},
    created_at=_STR, ready_at=_NSTR, destroyed_at=_NSTR, error=_NSTR,
)
TASK_VIEW = obj(
    id=_STR, name=_STR, owner=_STR,
    status={"type": "string", "enum": ["open", "closed"]},
    holder=_NSTR, held_since=_NSTR, last_activity_at=_STR, lease_quiet_at=_NSTR,
    closes_at=_NSTR, created_at=_STR, closed_at=_NSTR,
    close_reason={"type": ["string", "null"], "enum": ["closed", "idle", "operator", None]},
    vms={"type": "array", "items": VM_VIEW},
)
EVENT_VIEW = obj(id=_INT, type=_STR, at=_STR, actor=_STR, details={"type": "object"})

OUTPUTS: dict[str, dict[str, Any]] = {
    "task": obj(task=TASK_VIEW),
    "task_handle": obj(task=TASK_VIEW, handle=_STR),
    "attach": obj(task=TASK_VIEW, handle=_STR, previous_holder=_NSTR),
    "close": obj(task=TASK_VIEW, destroyed={"type": "array", "items": _STR}),
    "list": obj(tasks={"type": "array", "items": TASK_VIEW}, next_after=_NSTR),
    "events": obj(task_id=_STR, events={"type": "array", "items": EVENT_VIEW},
                  next_after=_INT, has_more=_BOOL),
    "vm": obj(vm=VM_VIEW),
    "exec": obj(exit_code={"type": ["integer", "null"]}, stdout=_STR, stderr=_STR,
                timed_out=_BOOL, truncated=_BOOL, duration_ms=_INT),
    "write": obj(path=_STR, bytes=_INT),
    "read": obj(path=_STR, content=_STR, bytes=_INT, truncated=_BOOL),
}
