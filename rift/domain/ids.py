"""Identifiers: `task_` / `vm_` / `tok_` / `pool_` / `exec_` / `snap_` / `vol_` + 8 lowercase base32
characters."""

from __future__ import annotations

import base64
import re
import secrets

_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
_ID_RE = re.compile(r"^(task|vm|tok|pool|exec|snap|exp|vol)_[a-z2-7]{8}$")


def _random_suffix() -> str:
    # 5 random bytes are exactly 8 base32 characters (40 bits).
    return base64.b32encode(secrets.token_bytes(5)).decode("ascii").lower()


def new_task_id() -> str:
    return "task_" + _random_suffix()


def new_vm_id() -> str:
    return "vm_" + _random_suffix()


def new_token_id() -> str:
    return "tok_" + _random_suffix()


def new_pool_id() -> str:
    return "pool_" + _random_suffix()


def new_exec_id() -> str:
    return "exec_" + _random_suffix()


def is_id(value: str, prefix: str) -> bool:
    match = _ID_RE.fullmatch(value)
    return match is not None and match.group(1) == prefix


def is_task_id(value: str) -> bool:
    return is_id(value, "task")


def is_vm_id(value: str) -> bool:
    return is_id(value, "vm")


__all__ = ["is_task_id", "is_vm_id", "new_task_id", "new_token_id", "new_vm_id"]


def is_pool_id(value: str) -> bool:
    return is_id(value, "pool")


def is_exec_id(value: str) -> bool:
    return is_id(value, "exec")


def new_snapshot_id() -> str:
    return "snap_" + _random_suffix()


def is_snapshot_id(value: str) -> bool:
    return is_id(value, "snap")


def new_exposure_id() -> str:
    return f"exp_{_random_suffix()}"


def new_volume_id() -> str:
    return "vol_" + _random_suffix()


def is_volume_id(value: str) -> bool:
    return is_id(value, "vol")


def new_context_id() -> str:
    """A code context's id (SPEC §20); a VM's first context is `default`."""
    return "ctx_" + _random_suffix()


def new_run_id() -> str:
    """One run of code in a context (SPEC §20)."""
    return "run_" + _random_suffix()
