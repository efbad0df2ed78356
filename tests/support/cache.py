"""Where slow test inputs are cached between runs (the tiny image, debootstrap
targets, .deb and wheel caches). `RIFT_TEST_CACHE` (set by scripts/test.sh to a
machine-wide folder, so fresh clones on one machine start warm), else
`var/cache` in the checkout."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RIFT_TEST_CACHE") or ROOT / "var" / "cache")
