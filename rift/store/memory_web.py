"""The Boxes page's rows in memory: the same answers as ``rift.store.sql_web``."""

from __future__ import annotations

from datetime import datetime

from rift.domain.model import Task
from rift.domain.records import ChangeMark, LoginFailures, WebSession
from rift.domain.store_errors import DuplicateKey, MissingReference
from rift.store.changes import check_limit, utc
from rift.store.memory_base import MemoryTxBase, utc_values


class MemoryWebQueries(MemoryTxBase):
    # sessions

    def add_session(self, session: WebSession) -> None:
        self._writing("add_session")
        if session.digest in self._s.sessions:
            raise DuplicateKey("web_sessions", "digest")
        if session.user not in self._s.users:
            raise MissingReference("web_sessions", "user")
        self._s.sessions[session.digest] = utc_values(session)

    def get_session(self, digest: str) -> WebSession | None:
        return self._s.sessions.get(digest)

    def delete_session(self, digest: str) -> bool:
        self._writing("delete_session")
        return self._s.sessions.pop(digest, None) is not None

    def purge_sessions(self, before: datetime) -> int:
        self._writing("purge_sessions")
        before = utc(before)
        gone = [d for d, s in self._s.sessions.items() if s.expires_at <= before]
        for digest in gone:
            del self._s.sessions[digest]
        return len(gone)

    # failed logins

    def get_login_failures(self, key: str) -> LoginFailures | None:
        return self._s.login_failures.get(key)

    def add_login_failure(self, key: str, at: datetime) -> int:
        self._writing("add_login_failure")
        was = self._s.login_failures.get(key)
        count = 1 if was is None else was.failures + 1
        self._s.login_failures[key] = LoginFailures(key, count, utc(at))
        return count

    def clear_login_failures(self, key: str) -> None:
        self._writing("clear_login_failures")
        self._s.login_failures.pop(key, None)

    def purge_login_failures(self, before: datetime) -> int:
        self._writing("purge_login_failures")
        before = utc(before)
        gone = [k for k, f in self._s.login_failures.items() if f.last_failed_at < before]
        for key in gone:
            del self._s.login_failures[key]
        return len(gone)

    # what the page reads

    def list_recently_closed(self, owner: str, limit: int) -> list[Task]:
        check_limit(limit)
        closed = [t for t in self._s.tasks.values() if t.owner == owner and t.status == "closed"]
        closed.sort(key=lambda t: (t.closed_at or t.created_at, self._s.task_seq[t.id]),
                    reverse=True)
        return closed[:limit]

    def change_mark(self) -> ChangeMark:
        open_activity = [t.last_activity_at for t in self._s.tasks.values() if t.is_open]
        return ChangeMark(self._s.last_event_id, max(open_activity, default=None))
