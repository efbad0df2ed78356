"""Timing helpers and the table every benchmark prints."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

TEST_CACHE = "/var/cache/rift-tests"  # where scripts/test.sh keeps the images


def use_test_cache() -> None:
    """Point RIFT_TEST_CACHE at the tests' image cache unless it is set (call it
    before importing tests.support, which reads it), where the cache can be made."""
    if os.environ.get("RIFT_TEST_CACHE"):
        return
    try:
        Path(TEST_CACHE).mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    os.environ["RIFT_TEST_CACHE"] = TEST_CACHE


@contextmanager
def work_dir(prefix: str = "rift-bench-") -> Iterator[Path]:
    """A temporary folder for one benchmark, removed after, that QEMU may pass
    through (0711): it runs as a user of its own (SPEC §15) and opens the disks,
    overlays and volumes a data dir below it holds."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = Path(tmp)
        folder.chmod(0o711)
        yield folder


def per_op(fn: Callable[[], object], n: int, warmup: int = 20) -> list[float]:
    """Seconds per call, one sample per call."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def print_table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n## {title}\n")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
