"""The SQL store when PostgreSQL does not answer: `StoreUnavailable` (code
`internal`, HTTP 503, "call again"), never a raw driver error; connections the
server cut are replaced on the next call, and a transaction cut half-way leaves
nothing behind. (tests/e2e/test_replicas.py restarts the server under two replicas.)
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, event, make_url, pool, text

from rift.domain.errors import StoreUnavailable
from rift.domain.model import User
from rift.store.sql import SqlStore
from tests.support.databases import migrated_and_empty, skip_without_postgres


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_store_whose_database_does_not_answer_says_unavailable() -> None:
    pytest.importorskip("psycopg")
    store = SqlStore(f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/rift",
                     pool_size=1)
    try:
        for transaction in (store.read, store.write):
            with pytest.raises(StoreUnavailable) as caught, transaction() as tx:
                tx.users.count()
            assert caught.value.code == "internal" and caught.value.status == 503
            assert "database" in caught.value.message and "again" in caught.value.hint
    finally:
        store.close()


APP = "rift-outage-test"  # names this test's store connections, and only those are cut


def cut_store_connections(url: str) -> int:
    """What a server restart does to a client's connections: the server ends them,
    each gone before this answers (the timeout waits for it; a cut that lands in the
    middle of the store's next ping is the test below)."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            return len(conn.execute(text(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE application_name = :app"), {"app": APP}).all())
    finally:
        engine.dispose()


def writes_and_reads_back(store: SqlStore) -> None:
    """The store works again: a write lands and a read sees it."""
    with store.write() as tx:
        tx.users.add(User("ada", None, datetime.now(UTC)))
    with store.read() as tx:
        assert [u.name for u in tx.users.all()] == ["ada"]


def test_connections_the_server_cut_are_replaced_and_a_cut_transaction_leaves_nothing() -> None:
    url = skip_without_postgres()
    migrated_and_empty(url)
    store = SqlStore(str(make_url(url).update_query_dict({"application_name": APP})),
                     pool_size=2)
    try:
        with store.read() as tx:
            assert tx.users.count() == 0  # a pooled connection now
        assert cut_store_connections(url) >= 1
        with store.read() as tx:  # pre-ping finds it dead and opens another
            assert tx.users.count() == 0

        with pytest.raises(StoreUnavailable), store.write() as tx:
            tx.users.add(User("ada", None, datetime.now(UTC)))
            cut_store_connections(url)
            tx.users.get("ada")
        with store.read() as tx:
            assert tx.users.all() == []
        writes_and_reads_back(store)
    finally:
        store.close()


def test_a_pooled_connection_whose_ping_fails_half_way_is_replaced() -> None:
    """A server that ends a connection while the store pings it (a restart, an
    operator's pg_terminate_backend) can leave the driver mid-query on a connection
    not yet closed, and the ping raises psycopg's ProgrammingError ("can't change
    'autocommit' now"), which SQLAlchemy does not take for a lost connection: seen
    once in a fresh-clone run (2026-12-06). Here the pooled connection is left
    mid-query on purpose; the store's next call replaces it and answers."""
    url = skip_without_postgres()
    migrated_and_empty(url)
    store = SqlStore(url, pool_size=1)
    try:
        def leave_mid_query(dbapi_connection: object, _record: object) -> None:
            dbapi_connection.pgconn.send_query(b"SELECT 1")  # type: ignore[attr-defined]

        event.listen(store.engine, "checkin", leave_mid_query, once=True)
        with store.read() as tx:
            assert tx.users.count() == 0
        with store.read() as tx:  # the ping fails; a new connection answers
            assert tx.users.count() == 0
        writes_and_reads_back(store)
    finally:
        store.close()
