"""Running the host tools that image code needs (apt, dpkg, qemu-img, an ISO
maker, ...): their stdout, or ImageError in their own words."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hypervisor.base import ImageError

COMMAND_TIMEOUT_S = 300


def run_command(argv: list[str], *, cwd: Path | None = None,
                timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run a tool the image code needs; its stdout, or ImageError in its own words."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,  # noqa: S603
                              check=False, timeout=timeout_s)
    except FileNotFoundError as exc:
        raise ImageError(f"{argv[0]} is not installed (scripts/libvirt.sh installs it)") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageError(f"{argv[0]} could not run: {exc}") from exc
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout
