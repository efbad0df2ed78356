"""Volumes' qcow2 files read with the real tools (qemu-img, qemu-io), no guest, for
the tests of volumes' files here and on hosts elsewhere."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

# the tests' mark: skipped, naming the tools, where they are not installed
NEEDS_TOOLS = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("qemu-img", "qemu-io", "mkfs.ext4")),
    reason="needs qemu-img, qemu-io and mkfs.ext4 (scripts/libvirt.sh installs them)")
HERE = "qemu:///system"
A, B, C = "vol_aaaaaaaa", "vol_bbbbbbbb", "vol_cccccccc"


def qcow2_info(path: Path) -> dict[str, object]:
    out = subprocess.run(["qemu-img", "info", "-U", "--output=json", str(path)],
                         check=True, capture_output=True, text=True).stdout
    info: dict[str, object] = json.loads(out)
    return info


def qemu_io(path: Path, command: str) -> str:
    """qemu-io's answer; a read's pattern check that fails says so (exit 1)."""
    done = subprocess.run(["qemu-io", "-f", "qcow2", "-c", command, str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 or "Pattern verification failed" in done.stdout, done
    return done.stdout


def has_ext4(path: Path) -> bool:
    # ext4's superblock at 1024, its magic 0xEF53 at offset 56 of it
    return "53 ef" in qemu_io(path, "read -v 1080 2")
