"""The store contract for the Boxes page: sessions, failed-login counts, the
recently closed list and the change mark, run against each database."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Table, create_engine, inspect

from rift.domain.ids import new_task_id
from rift.domain.model import NewEvent, Task, User
from rift.domain.records import WebSession
from rift.domain.store_errors import DuplicateKey, MissingReference, ReadOnlyTransaction
from rift.services.ports import Store
from rift.store import tables
from rift.store.migrate import current_revision, upgrade
from rift.store.sql import SqlStore

T0 = datetime(2026, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def with_user(store: Store, name: str = "ada") -> None:
    with store.write() as tx:
        tx.users.add(User(name=name, password_hash="$argon2id$x", created_at=T0))


def a_session(digest: str = "d" * 64, user: str = "ada", ttl_s: float = 3600) -> WebSession:
    return WebSession(digest=digest, user=user, created_at=T0, expires_at=at(ttl_s))


def a_task(owner: str = "ada", **changes: object) -> Task:
    task = Task(id=new_task_id(), owner=owner, name="t", status="open", lease_gen=1,
                secret_digest="a" * 64, holder="mcp:claude-code", held_since=T0,
                last_activity_at=T0, created_at=T0)
    return dataclasses.replace(task, **changes)  # type: ignore[arg-type]


# sessions


def test_a_session_reads_back_by_digest_and_is_deleted_once(store: Store) -> None:
    with_user(store)
    with store.write() as tx:
        tx.web.add_session(a_session())
    with store.read() as tx:
        assert tx.web.get_session("d" * 64) == a_session()
        assert tx.web.get_session("e" * 64) is None
    with store.write() as tx:
        assert tx.web.delete_session("d" * 64) is True
        assert tx.web.delete_session("d" * 64) is False
    with store.read() as tx:
        assert tx.web.get_session("d" * 64) is None


def test_a_session_needs_a_user_and_an_unused_digest(store: Store) -> None:
    with_user(store)
    with pytest.raises(MissingReference), store.write() as tx:
        tx.web.add_session(a_session(user="nobody"))
    with store.write() as tx:
        tx.web.add_session(a_session())
        with pytest.raises(DuplicateKey):
            tx.web.add_session(a_session())
        tx.web.add_session(a_session(digest="e" * 64))  # the transaction goes on
    with store.read() as tx:
        assert tx.web.get_session("e" * 64) is not None


def test_expired_sessions_are_purged_and_live_ones_stay(store: Store) -> None:
    with_user(store)
    with store.write() as tx:
        tx.web.add_session(a_session("a" * 64, ttl_s=10))
        tx.web.add_session(a_session("b" * 64, ttl_s=20))
        tx.web.add_session(a_session("c" * 64, ttl_s=30))
    with store.write() as tx:
        assert tx.web.purge_sessions(at(20)) == 2
    with store.read() as tx:
        assert tx.web.get_session("a" * 64) is None
        assert tx.web.get_session("b" * 64) is None
        assert tx.web.get_session("c" * 64) is not None


def test_a_read_block_refuses_session_changes(store: Store) -> None:
    with_user(store)
    with store.read() as tx:
        with pytest.raises(ReadOnlyTransaction):
            tx.web.add_session(a_session())
        with pytest.raises(ReadOnlyTransaction):
            tx.web.add_login_failure("k", T0)


# failed logins


def test_failed_logins_are_counted_per_key_and_cleared(store: Store) -> None:
    with store.write() as tx:
        assert tx.web.add_login_failure("pair:x", at(1)) == 1
        assert tx.web.add_login_failure("pair:x", at(2)) == 2
        assert tx.web.add_login_failure("addr:y", at(3)) == 1
    with store.read() as tx:
        found = tx.web.login_failures("pair:x")
        assert found is not None
        assert (found.failures, found.last_failed_at) == (2, at(2))
        assert tx.web.login_failures("nothing") is None
    with store.write() as tx:
        tx.web.clear_login_failures("pair:x")
        tx.web.clear_login_failures("pair:x")  # clearing twice is harmless
    with store.read() as tx:
        assert tx.web.login_failures("pair:x") is None
        assert tx.web.login_failures("addr:y") is not None


def test_old_failed_login_counts_are_purged(store: Store) -> None:
    with store.write() as tx:
        tx.web.add_login_failure("old", at(0))
        tx.web.add_login_failure("new", at(100))
    with store.write() as tx:
        assert tx.web.purge_login_failures(at(50)) == 1
    with store.read() as tx:
        assert tx.web.login_failures("old") is None
        assert tx.web.login_failures("new") is not None


# what the page reads


def test_recently_closed_lists_the_owners_closed_tasks_latest_closed_first(
        store: Store) -> None:
    early = a_task(status="closed", closed_at=at(10), close_reason="idle", created_at=at(3))
    late = a_task(status="closed", closed_at=at(20), close_reason="closed", created_at=at(1))
    middle = a_task(status="closed", closed_at=at(15), close_reason="operator",
                    created_at=at(2))
    other = a_task(owner="bob", status="closed", closed_at=at(30), close_reason="closed")
    still_open = a_task()
    with store.write() as tx:
        for task in (early, late, middle, other, still_open):
            tx.tasks.add(task)
    with store.read() as tx:
        assert [t.id for t in tx.tasks.recently_closed("ada", 10)] == [
            late.id, middle.id, early.id]
        assert [t.id for t in tx.tasks.recently_closed("ada", 2)] == [late.id, middle.id]
        assert tx.tasks.recently_closed("carol", 10) == []


def test_the_change_mark_moves_with_every_event_and_every_touch(store: Store) -> None:
    with store.read() as tx:
        empty = tx.web.change_mark()
    assert (empty.last_event_id, empty.last_activity_at) == (0, None)
    task = a_task()
    with store.write() as tx:
        tx.tasks.add(task)
        tx.events.add(NewEvent(task.id, "opened", T0, "mcp:x"))
    with store.read() as tx:
        opened = tx.web.change_mark()
    assert opened.last_event_id > 0
    assert opened.last_activity_at == T0
    with store.write() as tx:
        assert tx.tasks.touch(task.id, at(60), at(0))
    with store.read() as tx:
        touched = tx.web.change_mark()
    assert touched.last_activity_at == at(60)
    assert touched.token != opened.token
    with store.write() as tx:
        tx.events.add(NewEvent(task.id, "released", at(61), "mcp:x"))
    with store.read() as tx:
        released = tx.web.change_mark()
    assert released.last_event_id > touched.last_event_id
    assert released.token != touched.token


def test_the_change_mark_ignores_closed_tasks_activity(store: Store) -> None:
    with store.write() as tx:
        tx.tasks.add(a_task(status="closed", closed_at=at(5), last_activity_at=at(500)))
        tx.tasks.add(a_task(last_activity_at=at(7)))
    with store.read() as tx:
        assert tx.web.change_mark().last_activity_at == at(7)


# the migration


def _insert_as_of(url: str, table: Table, row: dict[str, Any]) -> None:
    """`row` inserted with only the columns `table` has in the database at `url` as
    it is now (an older revision's: the store's queries name today's columns)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            present = {column["name"] for column in inspect(conn).get_columns(table.name)}
            conn.execute(table.insert().values(**{k: v for k, v in row.items() if k in present}))
    finally:
        engine.dispose()


def test_migration_0002_upgrades_a_0001_database_keeping_its_rows(empty_sql_url: str) -> None:
    upgrade(empty_sql_url, "0001")
    task = a_task()
    _insert_as_of(empty_sql_url, tables.users,
                  dataclasses.asdict(User(name="ada", password_hash=None, created_at=T0)))
    _insert_as_of(empty_sql_url, tables.tasks, dataclasses.asdict(task))
    upgrade(empty_sql_url, "0002")
    assert current_revision(empty_sql_url) == "0002"
    upgrade(empty_sql_url)  # the store reads today's columns: the rows kept through to head
    new = SqlStore(empty_sql_url)
    try:
        with new.write() as tx:
            tx.web.add_session(a_session())
        with new.read() as tx:
            assert tx.tasks.get(task.id) == task
            assert tx.web.get_session("d" * 64) is not None
    finally:
        new.close()
