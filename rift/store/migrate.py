"""Schema migrations, applied at start: ``upgrade(url)`` brings a database to
the newest revision. The Alembic configuration is built here, in code; the
scripts live in ``rift/store/alembic`` and ship inside the package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

SCRIPT_LOCATION = Path(__file__).resolve().parent / "alembic"


def alembic_config(url: str) -> Config:
    """An Alembic ``Config`` for ``url`` with no alembic.ini behind it."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    # Passed as an attribute, not an option: URLs may hold '%', which the
    # ini-style options would take for interpolation.
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision`` (the newest by default)."""
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at; None when never migrated."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
