"""The data dir's modes (SPEC §15): Rift's own files 0600 in 0700 folders, made so
by a start on a fresh data dir and put back by the next start."""

from __future__ import annotations

import stat
from pathlib import Path

from rift.bootstrap import build_deps, close_deps, guest_runtime, qemu_gid
from rift.config import Settings

# Where QEMU runs as its own user (its group exists here), the folders it passes
# through are 0710 and that group's; else Rift's alone.
PASSED = 0o710 if qemu_gid() is not None else 0o700


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_start_makes_the_data_dir_0700_or_passable_by_qemu_and_the_database_0600(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = Settings(data_dir=data, hypervisor_uri="test:///default")
    deps = build_deps(settings)
    try:
        assert deps.guests is not None
        guest_runtime(settings)  # the serial logs' and disks' folders
    finally:
        close_deps(deps)
    assert _mode(data) == PASSED
    assert _mode(data / "rift.db") == 0o600
    for folder in ("keys", "serial"):
        assert _mode(data / folder) == 0o700, folder
    assert _mode(data / "disks") == PASSED
    if qemu_gid() is not None:
        assert data.stat().st_gid == (data / "disks").stat().st_gid == qemu_gid()
    # loosened by hand (or by an older Rift): the next start seals them again
    data.chmod(0o755)
    (data / "rift.db").chmod(0o644)
    close_deps(build_deps(settings))
    assert (_mode(data), _mode(data / "rift.db")) == (PASSED, 0o600)
    others = [p for p in data.rglob("*") if p.is_file() and _mode(p) & 0o077
              and p.suffix in (".db", ".key", "") and "images" not in p.parts]
    assert not others, others
