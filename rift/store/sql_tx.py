"""The SQL transaction: users, tokens, events and hosts here; tasks and VMs
in their own modules."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, func, select, update

from rift.domain.model import ApiToken, Event, Host, NewEvent, User
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.changes import HOST_CHANGEABLE, check_changes, check_limit
from rift.store.sql_meta import MetaQueries
from rift.store.sql_tasks import TaskQueries
from rift.store.sql_vms import VmQueries
from rift.store.sql_web import WebQueries
from rift.store.tables import api_tokens, events, hosts, users

_INSERT_EVENT = events.insert()
EVENT_COLUMNS = ["task_id", "type", "at", "actor", "details"]


def _user_of(row: Row[Any]) -> User:
    return User(**row._asdict())


def _token_of(row: Row[Any]) -> ApiToken:
    return ApiToken(**row._asdict())


def _host_of(row: Row[Any]) -> Host:
    return Host(**row._asdict())


def _event_of(row: Row[Any]) -> Event:
    return Event(**row._asdict())


class SqlTx(TaskQueries, VmQueries, WebQueries, MetaQueries):
    """Implements the engine's ``Tx`` port over one SQLAlchemy connection."""

    # users and tokens

    def add_user(self, user: User) -> None:
        self._writing("add_user")

        def diagnose() -> StoreError | None:
            return DuplicateKey("users", "name") if self.get_user(user.name) else None

        self._insert(users, dataclasses.asdict(user), diagnose)

    def get_user(self, name: str) -> User | None:
        row = self._conn.execute(select(users).where(users.c.name == name)).first()
        return None if row is None else _user_of(row)

    def list_users(self) -> list[User]:
        return [_user_of(row) for row in self._conn.execute(select(users).order_by(users.c.name))]

    def count_users(self) -> int:
        return int(self._conn.scalar(select(func.count()).select_from(users)) or 0)

    def add_token(self, token: ApiToken) -> None:
        self._writing("add_token")

        def diagnose() -> StoreError | None:
            if self.get_token(token.id) is not None:
                return DuplicateKey("api_tokens", "id")
            if self.get_token_by_digest(token.digest) is not None:
                return DuplicateKey("api_tokens", "digest")
            if self.get_user(token.user) is None:
                return MissingReference("api_tokens", "user")
            return None

        self._insert(api_tokens, dataclasses.asdict(token), diagnose)

    def get_token_by_digest(self, digest: str) -> ApiToken | None:
        query = select(api_tokens).where(api_tokens.c.digest == digest)
        row = self._conn.execute(query).first()
        return None if row is None else _token_of(row)

    def get_token(self, token_id: str) -> ApiToken | None:
        row = self._conn.execute(select(api_tokens).where(api_tokens.c.id == token_id)).first()
        return None if row is None else _token_of(row)

    def list_tokens(self, user: str) -> list[ApiToken]:
        query = (
            select(api_tokens)
            .where(api_tokens.c.user == user)
            .order_by(api_tokens.c.created_at, api_tokens.c.id)
        )
        return [_token_of(row) for row in self._conn.execute(query)]

    def revoke_token(self, token_id: str, at: datetime) -> bool:
        """True when this call revoked it; False when missing or already revoked."""
        self._writing("revoke_token")
        statement = (
            update(api_tokens)
            .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
            .values(revoked_at=at)
        )
        return self._conn.execute(statement).rowcount == 1

    # events

    def add_event(self, event: NewEvent) -> int:
        self._writing("add_event")
        row = {"task_id": event.task_id, "type": event.type, "at": event.at,
               "actor": event.actor, "details": event.details}
        if self._hot is not None:
            return int(self._hot.insert_event.execute(self._conn, row).lastrowid)
        result = self._conn.execute(_INSERT_EVENT, row)
        key = result.inserted_primary_key
        if key is None:  # pragma: no cover - every insert here has a key
            raise RuntimeError("the database gave the event no id")
        return int(key[0])

    def list_events(self, task_id: str, after_id: int, limit: int) -> list[Event]:
        """The task's events with ids above ``after_id``, oldest first."""
        check_limit(limit)
        query = (
            select(events)
            .where(events.c.task_id == task_id, events.c.id > after_id)
            .order_by(events.c.id)
            .limit(limit)
        )
        return [_event_of(row) for row in self._conn.execute(query)]

    # hosts

    def add_host(self, host: Host) -> None:
        self._writing("add_host")

        def diagnose() -> StoreError | None:
            return DuplicateKey("hosts", "name") if self.get_host(host.name) else None

        self._insert(hosts, dataclasses.asdict(host), diagnose)

    def get_host(self, name: str) -> Host | None:
        row = self._conn.execute(select(hosts).where(hosts.c.name == name)).first()
        return None if row is None else _host_of(row)

    def list_hosts(self) -> list[Host]:
        return [_host_of(row) for row in self._conn.execute(select(hosts).order_by(hosts.c.name))]

    def update_host(self, name: str, **changes: Any) -> bool:
        self._writing("update_host")
        check_changes("host", changes, HOST_CHANGEABLE)
        if not changes:
            return self._exists(hosts, hosts.c.name == name)
        statement = update(hosts).where(hosts.c.name == name).values(**changes)
        return self._conn.execute(statement).rowcount == 1

    def delete_host(self, name: str) -> bool:
        self._writing("delete_host")
        return self._conn.execute(delete(hosts).where(hosts.c.name == name)).rowcount == 1
