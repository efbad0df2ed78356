"""The project's own tools are set up as docs/development.md says: CI checks before it
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
    assert "make ci" in (ROOT / "docs" / "development.md").read_text()


def test_mypy_loads_the_pydantic_plugin() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "pydantic.mypy" in config["tool"]["mypy"]["plugins"]
    assert "plugins" not in config["tool"]["hatch"]["build"]["targets"]["wheel"]


def test_the_engines_limits_default_to_the_settings_defaults() -> None:
    """`Limits` (the engine's) and `Settings` (the operator's) name the same limits;
    their defaults must agree (they did not: cpu_overcommit was 1 and 4)."""
    from dataclasses import fields

    from rift.config import Settings
    from rift.services.context import Limits

    renamed = {"creating_grace_s": "vm_creating_grace_s"}
    for field in fields(Limits):
        setting = Settings.model_fields[renamed.get(field.name, field.name)]
        assert field.default == setting.default, field.name


def test_every_benchmark_imports_against_the_engine_as_it_is() -> None:
    # mypy does not check bench/; a use case renamed under it shows here, not at `make bench`.
    from bench.__main__ import benches

    assert {"mcp", "execs", "vms", "starts", "forks", "hostile"} <= set(benches())
