"""What the Boxes page keeps in SQL (``tx.web``): login sessions, failed-login
counts, and the change mark its live stream polls."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from sqlalchemy import Row, bindparam, delete, func, select, update

from rift.domain import code_contexts, usage, volumes
from rift.domain.records import ChangeMark, LoginFailures, WebSession
from rift.domain.store_errors import DuplicateKey, MissingReference, StoreError
from rift.store.sql_base import SqlRepository
from rift.store.tables import events, login_failures, meta, tasks, users, web_sessions

# One statement, five index lookups: the events primary key's last entry, the
# last entry of (status, last_activity_at) for open tasks, and three meta keys.
CHANGE_MARK = select(
    select(func.max(events.c.id)).scalar_subquery(),
    select(func.max(tasks.c.last_activity_at))
    .where(tasks.c.status == "open").scalar_subquery(),
    select(meta.c.value).where(meta.c.key == usage.MARK_KEY).scalar_subquery(),
    select(meta.c.value).where(meta.c.key == volumes.MARK_KEY).scalar_subquery(),
    select(meta.c.value).where(meta.c.key == code_contexts.MARK_KEY).scalar_subquery(),
)


# Built once with bind parameters: every request of a signed-in page reads it.
GET_SESSION = select(web_sessions).where(web_sessions.c.digest == bindparam("digest"))


def _session_of(row: Row[Any]) -> WebSession:
    return WebSession(**row._asdict())


class SqlWeb(SqlRepository):
    name = "web"

    # sessions

    def add_session(self, session: WebSession) -> None:
        self._writing("add_session")

        def diagnose() -> StoreError | None:
            if self.get_session(session.digest) is not None:
                return DuplicateKey("web_sessions", "digest")
            if not self._exists(users, users.c.name == session.user):
                return MissingReference("web_sessions", "user")
            return None

        self._insert(web_sessions, dataclasses.asdict(session), diagnose)

    def get_session(self, digest: str) -> WebSession | None:
        row = self._conn.execute(GET_SESSION, {"digest": digest}).first()
        return None if row is None else _session_of(row)

    def delete_session(self, digest: str) -> bool:
        self._writing("delete_session")
        statement = delete(web_sessions).where(web_sessions.c.digest == digest)
        return self._conn.execute(statement).rowcount == 1

    def purge_sessions(self, before: datetime) -> int:
        self._writing("purge_sessions")
        statement = delete(web_sessions).where(web_sessions.c.expires_at <= before)
        return int(self._conn.execute(statement).rowcount)

    # failed logins

    def login_failures(self, key: str) -> LoginFailures | None:
        query = select(login_failures).where(login_failures.c.key == key)
        row = self._conn.execute(query).first()
        return None if row is None else LoginFailures(**row._asdict())

    def add_login_failure(self, key: str, at: datetime) -> int:
        """An increment in the database (``failures + 1``), so concurrent
        failures on several replicas are all counted."""
        self._writing("add_login_failure")
        bump = (
            update(login_failures)
            .where(login_failures.c.key == key)
            .values(failures=login_failures.c.failures + 1, last_failed_at=at)
        )
        for _ in range(3):
            if self._conn.execute(bump).rowcount == 1:
                found = self.login_failures(key)
                return found.failures if found is not None else 1
            try:
                self._insert(login_failures, {"key": key, "failures": 1, "last_failed_at": at},
                             lambda: DuplicateKey("login_failures", "key"))
            except DuplicateKey:
                continue  # a concurrent first failure inserted it: count on it
            return 1
        raise RuntimeError(f"could not count a failed login under {key!r}")

    def uncount_login_failure(self, key: str) -> None:
        self._writing("uncount_login_failure")
        self._conn.execute(
            update(login_failures)
            .where(login_failures.c.key == key, login_failures.c.failures > 0)
            .values(failures=login_failures.c.failures - 1))

    def clear_login_failures(self, key: str) -> None:
        self._writing("clear_login_failures")
        self._conn.execute(delete(login_failures).where(login_failures.c.key == key))

    def purge_login_failures(self, before: datetime) -> int:
        self._writing("purge_login_failures")
        statement = delete(login_failures).where(login_failures.c.last_failed_at < before)
        return int(self._conn.execute(statement).rowcount)

    # what the page's live stream polls

    def change_mark(self) -> ChangeMark:
        row = self._conn.execute(CHANGE_MARK).one()
        last_event, last_activity, usage_mark, volumes_mark = row[0], row[1], row[2], row[3]
        return ChangeMark(int(last_event or 0), last_activity, usage_mark, volumes_mark, row[4])
