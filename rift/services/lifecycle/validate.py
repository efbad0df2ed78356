"""Ranges of SPEC §3 (declared once, in rift/contract/base.py), checked again by the
engine for callers that come through no door (the CLI, the scheduler, tests)."""

from __future__ import annotations

import base64
import binascii

from rift.contract.base import MAX_COMMAND, MAX_CONTENT, MAX_TEXT
from rift.domain import egress as egress_rules
from rift.domain.errors import InvalidArgument
from rift.domain.ids import is_exec_id, is_snapshot_id, is_task_id, is_vm_id
from rift.domain.model import Egress

__all__ = ["MAX_COMMAND", "MAX_CONTENT", "MAX_TEXT", "integer", "limit", "task_id", "text",
           "vm_id"]


def text(field: str, value: str | None, *, max_len: int = MAX_TEXT) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(field, "must be a string")
    if not 1 <= len(value) <= max_len:
        raise InvalidArgument(field, f"must be 1–{max_len} characters, got {len(value)}")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    return value


def egress(value: object) -> Egress:
    """`open`, `none` or an allowlist (a dict, or a model with `allow`), as it is kept."""
    allow = getattr(value, "allow", None)
    if allow is not None:
        value = {"allow": list(allow)}
    try:
        return egress_rules.canonical(value)
    except egress_rules.BadEntry as exc:
        raise InvalidArgument("egress", str(exc)) from None


def integer(field: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, "must be an integer")
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be between {low} and {high}, got {value}")
    return value


def limit(value: int | None, default: int = 50) -> int:
    return default if value is None else integer("limit", value, 1, 100)


def task_id(value: str, field: str = "task_id") -> str:
    if not isinstance(value, str) or not is_task_id(value):
        raise InvalidArgument(field, "a task id is task_ and 8 lowercase base32 characters")
    return value


def exec_id(value: str, field: str = "exec_id") -> str:
    if not isinstance(value, str) or not is_exec_id(value):
        raise InvalidArgument(field, "an exec id is exec_ and 8 lowercase base32 characters")
    return value


def snapshot_id(value: str, field: str = "snapshot_id") -> str:
    if not isinstance(value, str) or not is_snapshot_id(value):
        raise InvalidArgument(field, "a snapshot id is snap_ and 8 lowercase base32 characters")
    return value


def vm_id(value: str, field: str = "vm_id") -> str:
    if not isinstance(value, str) or not is_vm_id(value):
        raise InvalidArgument(field, "a VM id is vm_ and 8 lowercase base32 characters")
    return value


def decoded(field: str, text: str, encoding: str) -> bytes:
    """The bytes `text` carries in `encoding` (utf-8 or base64), at most 16 MiB."""
    if len(text) > MAX_CONTENT * (4 / 3 if encoding == "base64" else 1) + 4:
        raise InvalidArgument(field, "at most 16 MiB")
    if encoding == "utf-8":
        data = text.encode("utf-8")
    else:
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidArgument(field, f"not valid base64: {exc}") from exc
    if len(data) > MAX_CONTENT:
        raise InvalidArgument(field, "at most 16 MiB")
    return data


def encoding(value: str | None) -> str:
    """A text encoding of bytes in a call: utf-8 (the default) or base64."""
    chosen = value or "utf-8"
    if chosen not in ("utf-8", "base64"):
        raise InvalidArgument("encoding", "one of utf-8, base64")
    return chosen
