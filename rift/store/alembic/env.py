"""Alembic's environment for Rift. ``rift.store.migrate.upgrade(url)`` runs it.

The URL comes from ``config.attributes["url"]`` (set by ``migrate.py``) or,
for the ``alembic`` command, from ``sqlalchemy.url``. All migrations run in one
transaction that first takes a lock, so replicas starting together migrate
once: PostgreSQL takes an advisory lock, SQLite the write lock.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, event, pool, text

from rift.store.tables import metadata

# Any constant both sides agree on; "rift" in ASCII.
MIGRATION_LOCK_ID = 0x72696674

config = context.config


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: call rift.store.migrate.upgrade(url)")
    return str(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _sqlite_begin_immediate(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    if engine.dialect.name == "sqlite":
        # The driver's own BEGIN would leave DDL outside the transaction.
        event.listen(engine, "connect", lambda dbapi, _rec: setattr(dbapi, "isolation_level", None))
        event.listen(engine, "begin", _sqlite_begin_immediate)
    try:
        with engine.connect() as connection, connection.begin():
            if engine.dialect.name == "postgresql":
                lock = text("SELECT pg_advisory_xact_lock(:id)")
                connection.execute(lock, {"id": MIGRATION_LOCK_ID})
            context.configure(
                connection=connection, target_metadata=metadata, transactional_ddl=True
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
