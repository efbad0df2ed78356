"""Secrets as values: handles and API tokens, stored only as SHA-256 digests.

A secret is 32 random bytes. Handles and tokens hide their secret in ``repr``;
comparisons are constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from functools import cached_property

from rift.domain.ids import is_task_id

SECRET_BYTES = 32
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")
_TOKEN_RE = re.compile(r"^rift_[A-Za-z0-9_-]{43}$")


def new_secret() -> str:
    """32 random bytes in unpadded URL-safe base64 (43 characters)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(SECRET_BYTES)).rstrip(b"=").decode()


def digest(secret: str) -> str:
    """The hex SHA-256 digest that is all Rift ever stores of a secret."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def matches(secret: str, stored_digest: str | None) -> bool:
    if stored_digest is None:
        return False
    return hmac.compare_digest(digest(secret), stored_digest)


@dataclass(frozen=True)
class Handle:
    """`<task id>.<secret>`: what the holder of a task's lease presents."""

    task_id: str
    secret: str = field(repr=False)

    def __str__(self) -> str:
        return f"{self.task_id}.{self.secret}"

    def __repr__(self) -> str:
        return f"Handle(task_id={self.task_id!r}, secret=<hidden>)"

    @cached_property
    def digest(self) -> str:
        return digest(self.secret)

    @classmethod
    def mint(cls, task_id: str) -> Handle:
        return cls(task_id, new_secret())

    @classmethod
    def parse(cls, text: str) -> Handle | None:
        """The handle in ``text``, or None when it is not of the form."""
        task_id, dot, secret = text.strip().partition(".")
        if not dot or not is_task_id(task_id) or not _SECRET_RE.fullmatch(secret):
            return None
        return cls(task_id, secret)


@dataclass(frozen=True)
class Token:
    """An API token `rift_<secret>`; only its digest is stored."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Token(<hidden>)"

    @property
    def digest(self) -> str:
        return digest(self.value)

    @classmethod
    def mint(cls) -> Token:
        return cls("rift_" + new_secret())

    @staticmethod
    def looks_valid(text: str) -> bool:
        return bool(_TOKEN_RE.fullmatch(text))


EXPOSURE_SECRET_BYTES = 20  # 160 bits
_EXPOSURE_RE = re.compile(r"^[a-z2-7]{32}$")


def new_exposure_secret() -> str:
    """An exposure's secret: 20 random bytes in lowercase unpadded base32 (32
    characters), so it is one DNS label of a preview domain's host name as well
    as one segment of a path."""
    raw = secrets.token_bytes(EXPOSURE_SECRET_BYTES)
    return base64.b32encode(raw).decode().rstrip("=").lower()


def is_exposure_secret(text: str) -> bool:
    return bool(_EXPOSURE_RE.match(text))
