"""Migrations at start (rift/store/migrate.py): a database behind is brought to the
newest revision; one at it is left as it is without loading Alembic, on SQLite
and PostgreSQL; the newest revision read from the scripts' names is Alembic's."""

from __future__ import annotations

import re
import subprocess
import sys

from rift.store.migrate import (
    VERSIONS,
    current_revision,
    head_revision,
    newest_revision,
    upgrade,
    upgrade_if_behind,
)


def test_each_script_holds_the_revision_its_name_says_and_the_newest_is_alembics_head() -> None:
    scripts = sorted(VERSIONS.glob("*.py"))
    assert scripts
    for script in scripts:
        said = re.search(r'^revision: str = "(\d{4})"$', script.read_text(), re.MULTILINE)
        assert said is not None and script.name.startswith(said.group(1) + "_"), script.name
    assert newest_revision() == head_revision() == scripts[-1].name[:4]


def test_a_database_behind_is_migrated_and_one_at_the_newest_is_left_as_it_is(
        empty_sql_url: str) -> None:
    assert current_revision(empty_sql_url) is None  # never migrated: no table
    upgrade(empty_sql_url, "0001")
    assert current_revision(empty_sql_url) == "0001"
    upgrade_if_behind(empty_sql_url)
    assert current_revision(empty_sql_url) == newest_revision()
    upgrade_if_behind(empty_sql_url)  # at the newest: nothing to do
    assert current_revision(empty_sql_url) == newest_revision()


def test_a_database_at_the_newest_revision_loads_no_alembic(empty_sql_url: str) -> None:
    upgrade(empty_sql_url)
    check = ("import sys\nfrom rift.store.migrate import upgrade_if_behind\n"
             f"upgrade_if_behind({empty_sql_url!r})\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))")
    ran = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         timeout=60, check=True)
    assert ran.stdout.strip() == "[]", ran.stdout
