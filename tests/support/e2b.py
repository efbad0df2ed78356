"""E2B's own SDK (`e2b`, pinned in pyproject's dev extras) pointed at a `rift serve`:
the two settings of SPEC §16 (`E2B_API_URL=E2B_SANDBOX_URL=<rift>/e2b`,
`E2B_API_KEY=<a Rift token>`), passed per call rather than through the
environment, so tests in one process can talk to several servers as several users."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.support.servers import cached_tiny


def e2b_opts(url: str, token: str) -> dict[str, Any]:
    """The SDK's connection options for `rift serve` at `url` as the token's user."""
    return {"api_url": url + "/e2b", "sandbox_url": url + "/e2b", "api_key": token,
            "request_timeout": 120}


def own_tiny(data_dir: Path) -> Path:
    """Give a data dir a copy of the cached `tiny` (not a link): libvirt's DAC driver
    refuses a kernel file another domain, started under other QEMU user settings,
    still holds; a copy is this server's alone."""
    images = data_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    target = images / "tiny"
    if not target.exists():
        shutil.copytree(cached_tiny(), target)
    return images
