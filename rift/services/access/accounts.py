"""Users (argon2id password hashes) and API tokens (SHA-256 digests, shown once)."""

from __future__ import annotations

import functools
import re
import secrets
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from rift.domain.errors import InvalidArgument, Unauthorized
from rift.domain.ids import new_token_id
from rift.domain.model import ApiToken, User
from rift.domain.secrets import Token
from rift.services.context import Caller, Deps

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_HASHER = PasswordHasher()  # argon2id with the library's RFC 9106 low-memory profile


@functools.cache
def _dummy_hash() -> str:
    """What an unknown user's password is checked against (as long to check as a known
    one's). Made once, not at import (each `rift` command would pay 0.1 s for it):
    `rift serve` makes it before it takes a call (prepare_logins)."""
    return _HASHER.hash("rift: a password no one has")


def prepare_logins() -> None:
    """Make what the first login needs, so that it takes no longer than the next."""
    _dummy_hash()


def _check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise InvalidArgument("name", "1–64 of a-z 0-9 _ . -, starting with a letter or digit")
    return name


def hash_password(password: str) -> str:
    return _HASHER.hash(password)


def add_user(deps: Deps, name: str, password: str | None = None) -> User:
    _check_name(name)
    if password is not None and not 8 <= len(password) <= 1024:
        raise InvalidArgument("password", "must be 8–1024 characters")
    user = User(name, hash_password(password) if password else None, deps.clock.now())
    with deps.store.write() as tx:
        if tx.users.get(name) is not None:
            raise InvalidArgument("name", f"a user {name!r} exists already")
        tx.users.add(user)
    return user


def list_users(deps: Deps) -> list[User]:
    with deps.store.read() as tx:
        return tx.users.all()


def verify_password(deps: Deps, name: str, password: str) -> bool:
    """True when the password is the user's. An unknown user costs one verify too,
    so the answer's time says nothing about which names exist."""
    with deps.store.read() as tx:
        user = tx.users.get(name)
    stored = user.password_hash if user and user.password_hash else _dummy_hash()
    try:
        ok = _HASHER.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False
    return ok and user is not None and user.password_hash is not None


@dataclass(frozen=True)
class NewToken:
    record: ApiToken
    token: Token  # shown once, never stored


def new_token(deps: Deps, user: str, label: str | None = None,
              operator: bool = False) -> NewToken:
    """A token for `user`; an operator's (`operator=True`) also reads every user's
    per-VM and per-task series in /metrics."""
    label = label or f"token-{secrets.token_hex(2)}"
    if not 1 <= len(label) <= 64 or not label.isprintable():
        raise InvalidArgument("label", "1–64 printable characters")
    token = Token.mint()
    record = ApiToken(new_token_id(), user, label, token.digest, deps.clock.now(),
                      operator=operator)
    with deps.store.write() as tx:
        if tx.users.get(user) is None:
            raise InvalidArgument("user", f"no user {user!r}; rift user add {user} makes one")
        tx.tokens.add(record)
    return NewToken(record, token)


def list_tokens(deps: Deps, user: str) -> list[ApiToken]:
    with deps.store.read() as tx:
        return tx.tokens.of_user(user)


def revoke_token(deps: Deps, token_id: str) -> bool:
    with deps.store.write() as tx:
        return tx.tokens.revoke(token_id, deps.clock.now())


def authenticate(deps: Deps, bearer: str | None) -> tuple[ApiToken, Caller]:
    """The token's record and the caller it names (label `api:<label>`, an operator
    when the token was made as one)."""
    if not bearer or not Token.looks_valid(bearer):
        raise Unauthorized()
    with deps.store.read() as tx:
        record = tx.tokens.by_digest(Token(bearer).digest)
    if record is None or record.revoked_at is not None:
        raise Unauthorized()
    return record, Caller(record.user, record.holder_label, operator=record.operator)
