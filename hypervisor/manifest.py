"""An image folder's manifest and its swap: the digest of what a build was made
from, whether the folder there is up to date with it, the size and sha256 of
each file, and putting a new build in the old one's place."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

MANIFEST = "manifest.json"


def up_to_date(target: Path, inputs: str, parts: tuple[str, ...] = ("kernel", "initrd")) -> bool:
    """Whether `target`'s manifest was made from `inputs` and its files are whole."""
    try:
        manifest = json.loads((target / MANIFEST).read_text())
        if manifest.get("inputs") != inputs:
            return False
        for part in parts:
            facts = manifest[part]
            if (target / facts["file"]).stat().st_size != facts["bytes"]:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def file_facts(path: Path) -> dict[str, object]:
    """The size and sha256 of a file, as a manifest records them."""
    return {"bytes": path.stat().st_size, "sha256": sha256(path.read_bytes())}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """A file's sha256, read a MiB at a time (disks are large)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def digest(data: bytes) -> str:
    """`sha256:<hex>` of `data`: how a manifest names its inputs."""
    return "sha256:" + sha256(data)


def swap_in(out: Path, target: Path, work: Path) -> None:
    """Replace `target` with `out` (the old one is moved into `work`, which the
    caller removes); running guests keep what QEMU already read."""
    old = work / "old"
    if target.exists():
        target.rename(old)
    out.rename(target)
    for path in target.iterdir():
        path.chmod(0o644)
    os.utime(target, (time.time(), time.time()))
