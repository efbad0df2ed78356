"""The reliability campaign's shared state: its size (short in `make test`, long
in `make soak`), the figures each test records for the summary table, and every
secret the campaign made (handle secrets, tokens, passwords, private keys) with
every place a server wrote to, for the final search
(tests/reliability/test_secrets.py).

`RIFT_SOAK=1` selects the long form. The summary table is printed at the end of
the run and written as JSON to `RIFT_RELIABILITY_REPORT` when that is set."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

SOAK = os.environ.get("RIFT_SOAK") == "1"
T = TypeVar("T")


def scale(short: T, soak: T) -> T:
    """`short` in `make test`, `soak` in `make soak`."""
    return soak if SOAK else short


@dataclass(frozen=True)
class Figure:
    section: str  # Races, Crashes, Load, Bad input, Secrets, Time
    what: str
    value: str
    goal: str = ""


_lock = threading.Lock()
FIGURES: list[Figure] = []
SECRETS: set[str] = set()
WRITTEN: set[Path] = set()  # data dirs and logs of the campaign's servers


def record(section: str, what: str, value: object, goal: str = "") -> None:
    """One line of the summary table."""
    shown = f"{value:.3g}" if isinstance(value, float) else str(value)
    with _lock:
        FIGURES.append(Figure(section, what, shown, goal))


def secret(*values: str) -> None:
    """Secrets made during the campaign: none may be found anywhere at its end."""
    with _lock:
        SECRETS.update(v for v in values if v)


def handle_secret(handle: str) -> None:
    """A handle `task_<id>.<secret>`: its secret part is what must stay unwritten."""
    secret(handle.partition(".")[2])


def wrote(*paths: Path) -> None:
    """Where a campaign server keeps files (its data dir, its log)."""
    with _lock:
        WRITTEN.update(paths)


def table() -> str:
    rows = [("section", "what", "figure", "goal")] + [
        (f.section, f.what, f.value, f.goal) for f in FIGURES]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report(path: Path) -> None:
    path.write_text(json.dumps({"form": "soak" if SOAK else "short",
                                "figures": [asdict(f) for f in FIGURES]}, indent=1))


def enlist(data_dir: Path, log: Path, *secrets: str) -> None:
    """A campaign server: its data dir and log are searched at the end, and its
    admin's password and token (`secrets`) must not be found there."""
    wrote(data_dir, log)
    secret(*secrets)


def harvest_keys(data_dir: Path) -> int:
    """Take note of the private keys of open tasks under `data_dir/keys` (call it
    while tasks are open: closing a task deletes its key). Only the lines that
    carry private material are kept: an OpenSSH key's first lines (its header and
    public key) are common or public. Answers how many keys were seen."""
    keys = data_dir / "keys"
    seen = 0
    for path in keys.glob("task_*") if keys.is_dir() else ():
        try:
            body = [line for line in path.read_text().splitlines() if "-----" not in line]
        except OSError:  # closed meanwhile
            continue
        secret(*[line for line in body[2:-1] if len(line) >= 40])
        seen += 1
    return seen
