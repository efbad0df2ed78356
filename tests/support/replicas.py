"""Replicas of `rift serve` on one PostgreSQL database and one shared host:
libvirt's test driver inside libvirtd (`test+unix:///default`), which every
client of the daemon sees alike (why: tests/e2e/replicas.py, whose fixtures
start them). One replica's environment, its admin, the shared host's domains."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SHARED_URI = "test+unix:///default"  # the test driver inside libvirtd: one host for all


def shared_host_missing() -> str | None:
    try:
        answer = subprocess.run(["virsh", "-c", SHARED_URI, "version"], capture_output=True,
                                text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"virsh -c {SHARED_URI} failed: {exc}"
    if answer.returncode != 0:
        return (f"libvirtd does not serve the test driver on {SHARED_URI} "
                f"({answer.stderr.strip()}); scripts/libvirt.sh starts libvirtd")
    return None


def replica_env(url: str, tmp: Path, **extra: str) -> dict[str, str]:
    """One replica's environment: its own data dir, the shared database and host."""
    return {**os.environ, "RIFT_DATA_DIR": str(tmp / "data"), "RIFT_DATABASE_URL": url,
            "RIFT_HYPERVISOR_URI": SHARED_URI, "RIFT_HOST_VCPUS": "64",
            "RIFT_HOST_MEMORY_MIB": "65536", **extra}


def admin_of(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The admin's password and token, as the replica that made them printed them."""
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    password = re.search(r"password: (\S+)", lines[1])
    token = re.search(r"token:\s+(rift_\S+)", lines[2])
    assert password and token, lines
    return password.group(1), token.group(1)


def shared_domains() -> set[str]:
    """Every domain on the shared host, running or only defined."""
    listed = subprocess.run(["virsh", "-c", SHARED_URI, "list", "--all", "--name"],
                            capture_output=True, text=True, timeout=30, check=True)
    return {line.strip() for line in listed.stdout.splitlines() if line.strip()}
