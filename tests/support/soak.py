"""Long forms and `make soak`. `RIFT_SOAK=1` (set by `make soak`) is the one switch,
as for the reliability campaign (tests/support/campaign.py reads the same
variable). Tests marked `soak` are what `make soak` runs beyond tests/reliability
(`-m soak`):

- `long_form(...)`: a test that runs only under `make soak`; `make test` skips it,
  saying which tests cover its behaviour there (a long form is never the only one);
- `scale(short, soak)`: a test that runs in both, its size chosen here (mark it
  `soak` so that `make soak` runs its long size)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import pytest

SOAK = os.environ.get("RIFT_SOAK") == "1"
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


def scale(short: T, soak: T) -> T:
    """`short` in `make test`, `soak` in `make soak`."""
    return soak if SOAK else short


def long_form(covered_by: str) -> Callable[[F], F]:
    """Mark a test `soak` and skip it outside `make soak`; `covered_by` names what
    covers the same behaviour in `make test`."""
    def mark(test: F) -> F:
        skipped = pytest.mark.skipif(
            not SOAK, reason=f"a long form: make soak runs it (make test: {covered_by})")
        return skipped(pytest.mark.soak(test))
    return mark
