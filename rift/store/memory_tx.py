"""The in-memory transaction: the engine's ``Tx`` port over a ``MemoryState``.
Users, tokens, events and hosts here; tasks and VMs in their own modules."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from rift.domain.model import ApiToken, Event, Host, NewEvent, User
from rift.domain.store_errors import DuplicateKey, MissingReference
from rift.store.changes import HOST_CHANGEABLE, check_changes, check_limit, utc
from rift.store.memory_base import json_copy, utc_values
from rift.store.memory_meta import MemoryMetaQueries
from rift.store.memory_tasks import MemoryTaskQueries
from rift.store.memory_vms import MemoryVmQueries
from rift.store.memory_web import MemoryWebQueries


class MemoryTx(MemoryTaskQueries, MemoryVmQueries, MemoryWebQueries, MemoryMetaQueries):
    """Implements the engine's ``Tx`` port in memory."""

    # users and tokens

    def add_user(self, user: User) -> None:
        self._writing("add_user")
        if user.name in self._s.users:
            raise DuplicateKey("users", "name")
        self._s.users[user.name] = utc_values(user)

    def get_user(self, name: str) -> User | None:
        return self._s.users.get(name)

    def list_users(self) -> list[User]:
        return sorted(self._s.users.values(), key=lambda u: u.name)

    def count_users(self) -> int:
        return len(self._s.users)

    def add_token(self, token: ApiToken) -> None:
        self._writing("add_token")
        if token.id in self._s.tokens:
            raise DuplicateKey("api_tokens", "id")
        if any(t.digest == token.digest for t in self._s.tokens.values()):
            raise DuplicateKey("api_tokens", "digest")
        if token.user not in self._s.users:
            raise MissingReference("api_tokens", "user")
        self._s.tokens[token.id] = utc_values(token)

    def get_token_by_digest(self, digest: str) -> ApiToken | None:
        return next((t for t in self._s.tokens.values() if t.digest == digest), None)

    def get_token(self, token_id: str) -> ApiToken | None:
        return self._s.tokens.get(token_id)

    def list_tokens(self, user: str) -> list[ApiToken]:
        mine = [t for t in self._s.tokens.values() if t.user == user]
        return sorted(mine, key=lambda t: (t.created_at, t.id))

    def revoke_token(self, token_id: str, at: datetime) -> bool:
        self._writing("revoke_token")
        token = self._s.tokens.get(token_id)
        if token is None or token.revoked_at is not None:
            return False
        self._s.tokens[token_id] = dataclasses.replace(token, revoked_at=utc(at))
        return True

    # events

    def add_event(self, event: NewEvent) -> int:
        self._writing("add_event")
        self._s.last_event_id += 1
        event_id = self._s.last_event_id
        self._s.events[event_id] = Event(
            id=event_id,
            task_id=event.task_id,
            type=event.type,
            at=utc(event.at),
            actor=event.actor,
            details=json_copy(event.details),
        )
        return event_id

    def list_events(self, task_id: str, after_id: int, limit: int) -> list[Event]:
        check_limit(limit)
        mine = [e for i, e in self._s.events.items() if e.task_id == task_id and i > after_id]
        return [dataclasses.replace(e, details=json_copy(e.details)) for e in mine[:limit]]

    # hosts

    def add_host(self, host: Host) -> None:
        self._writing("add_host")
        if host.name in self._s.hosts:
            raise DuplicateKey("hosts", "name")
        self._s.hosts[host.name] = utc_values(host)

    def get_host(self, name: str) -> Host | None:
        return self._s.hosts.get(name)

    def list_hosts(self) -> list[Host]:
        return sorted(self._s.hosts.values(), key=lambda h: h.name)

    def update_host(self, name: str, **changes: Any) -> bool:
        self._writing("update_host")
        check_changes("host", changes, HOST_CHANGEABLE)
        host = self._s.hosts.get(name)
        if host is None:
            return False
        self._s.hosts[name] = dataclasses.replace(host, **changes)
        return True

    def delete_host(self, name: str) -> bool:
        self._writing("delete_host")
        return self._s.hosts.pop(name, None) is not None
