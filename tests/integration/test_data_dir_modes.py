"""The data dir's modes (SPEC §15): Rift's own files 0600 in 0700 folders, made so
by a start on a fresh data dir and put back by the next start."""

from __future__ import annotations

import stat
from pathlib import Path

from rift.bootstrap import build_deps, close_deps, guest_runtime
from rift.config import Settings


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_start_makes_the_data_dir_0700_and_the_database_and_keys_0600(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = Settings(data_dir=data, hypervisor_uri="test:///default")
    deps = build_deps(settings)
    try:
        assert deps.guests is not None
        guest_runtime(settings)  # the serial logs' and disks' folders
    finally:
        close_deps(deps)
    assert _mode(data) == 0o700
    assert _mode(data / "rift.db") == 0o600
    for folder in ("keys", "serial", "disks"):
        assert _mode(data / folder) == 0o700, folder
    # loosened by hand (or by an older Rift): the next start seals them again
    data.chmod(0o755)
    (data / "rift.db").chmod(0o644)
    close_deps(build_deps(settings))
    assert (_mode(data), _mode(data / "rift.db")) == (0o700, 0o600)
    others = [p for p in data.rglob("*") if p.is_file() and _mode(p) & 0o077
              and p.suffix in (".db", ".key", "") and "images" not in p.parts]
    assert not others, others
