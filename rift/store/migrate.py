"""Schema migrations, applied at start: ``upgrade(url)`` brings a database to
the newest revision. The Alembic configuration is built here, in code; the
scripts live in ``rift/store/alembic`` and ship inside the package.

Alembic is imported only to migrate: ``upgrade_if_behind(url)`` first reads the
database's revision with one query and leaves a database already at the newest
as it is (importing Alembic took 0.11-0.18 s of each `rift` command and each
`rift serve` start, most of them on a database at the newest revision). The
newest revision is read from the scripts' names, `NNNN_what.py` holding revision
`NNNN` (tests/integration/test_migrate.py holds them to it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, inspect, pool, text

if TYPE_CHECKING:
    from alembic.config import Config

SCRIPT_LOCATION = Path(__file__).resolve().parent / "alembic"
VERSIONS = SCRIPT_LOCATION / "versions"


def alembic_config(url: str) -> Config:
    """An Alembic ``Config`` for ``url`` with no alembic.ini behind it."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    # Passed as an attribute, not an option: URLs may hold '%', which the
    # ini-style options would take for interpolation.
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision`` (the newest by default)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def upgrade_if_behind(url: str) -> None:
    """``upgrade(url)`` unless the database is at the newest revision already."""
    if current_revision(url) != newest_revision():
        upgrade(url)


def newest_revision() -> str:
    """The newest script's revision, from its name, without loading Alembic."""
    return max(p.name.split("_", 1)[0] for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(url: str) -> str | None:
    """The revision Alembic's table at ``url`` names; None when never migrated
    (read with one query: no Alembic loaded)."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table("alembic_version"):
                return None
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    finally:
        engine.dispose()
    return str(rows[0][0]) if len(rows) == 1 else None
