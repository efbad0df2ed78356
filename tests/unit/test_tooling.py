"""The project's own tools are set up as the README says: CI checks before it
tests, and mypy runs with pydantic's plugin."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_make_check_before_the_suite() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make ci$", ci, re.M), ci
    target = re.search(r"^ci: *(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert target is not None and target.group(1).split() == ["check", "test"]
    assert "make ci" in (ROOT / "README.md").read_text()


def test_mypy_loads_the_pydantic_plugin() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "pydantic.mypy" in config["tool"]["mypy"]["plugins"]
    assert "plugins" not in config["tool"]["hatch"]["build"]["targets"]["wheel"]
