"""Users and API tokens in SQL (``tx.users``, ``tx.tokens``)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from sqlalchemy import Row, bindparam, func, select, update

from rift.domain.model import ApiToken, User
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import api_tokens, users

# Built once with bind parameters: every call with a bearer token reads it.
TOKEN_BY_DIGEST = select(api_tokens).where(api_tokens.c.digest == bindparam("digest"))


def _user_of(row: Row[Any]) -> User:
    return User(**row._asdict())


def _token_of(row: Row[Any]) -> ApiToken:
    return ApiToken(**row._asdict())


class SqlUsers(SqlRepository):
    name = "users"

    def add(self, user: User) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            return DuplicateKey("users", "name") if self.get(user.name) else None

        self._insert(users, dataclasses.asdict(user), diagnose)

    def get(self, name: str) -> User | None:
        row = self._conn.execute(select(users).where(users.c.name == name)).first()
        return None if row is None else _user_of(row)

    def all(self) -> list[User]:
        return [_user_of(row) for row in self._conn.execute(select(users).order_by(users.c.name))]

    def count(self) -> int:
        return int(self._conn.scalar(select(func.count()).select_from(users)) or 0)


class SqlTokens(SqlRepository):
    name = "tokens"

    def add(self, token: ApiToken) -> None:
        self._writing("add")

        def diagnose() -> StoreError | None:
            if self.get(token.id) is not None:
                return DuplicateKey("api_tokens", "id")
            if self.by_digest(token.digest) is not None:
                return DuplicateKey("api_tokens", "digest")
            if not self._exists(users, users.c.name == token.user):
                return MissingReference("api_tokens", "user")
            return None

        self._insert(api_tokens, dataclasses.asdict(token), diagnose)

    def get(self, token_id: str) -> ApiToken | None:
        row = self._conn.execute(select(api_tokens).where(api_tokens.c.id == token_id)).first()
        return None if row is None else _token_of(row)

    def by_digest(self, digest: str) -> ApiToken | None:
        row = self._conn.execute(TOKEN_BY_DIGEST, {"digest": digest}).first()
        return None if row is None else _token_of(row)

    def of_user(self, user: str) -> list[ApiToken]:
        query = (
            select(api_tokens)
            .where(api_tokens.c.user == user)
            .order_by(api_tokens.c.created_at, api_tokens.c.id)
        )
        return [_token_of(row) for row in self._conn.execute(query)]

    def revoke(self, token_id: str, at: datetime) -> bool:
        """True when this call revoked it; False when missing or already revoked."""
        self._writing("revoke")
        statement = (
            update(api_tokens)
            .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
            .values(revoked_at=at)
        )
        return self._conn.execute(statement).rowcount == 1
