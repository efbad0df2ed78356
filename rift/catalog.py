"""The image catalog (the ImageCatalog port's adapters): `tiny` and `debian`
are always known; further images are folders under `<data dir>/images/<name>/` (built, or
registered with `rift image add`)."""

from __future__ import annotations

import re
from pathlib import Path

from hypervisor.qcow2 import KIND_KERNEL, image_kind
from hypervisor.snapshot_image import fixed_sizes

BUILTIN = ("tiny", "debian")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class DirectoryImages:
    def __init__(self, root: Path) -> None:
        self.root = root

    def names(self) -> list[str]:
        found = set(BUILTIN)
        if self.root.is_dir():
            found |= {p.name for p in self.root.iterdir() if p.is_dir() and _NAME_RE.match(p.name)}
        return sorted(found)

    def is_built(self, name: str) -> bool:
        return (self.root / name).is_dir()

    def kind(self, name: str) -> str:
        """`qcow2` (registered with `rift image add`), `snapshot` (made from a
        snapshot with `rift image add --snapshot`) or `kernel` (direct kernel boot,
        as `tiny` and `debian`; also what an image not built yet will be)."""
        return image_kind(self.root, name) or KIND_KERNEL

    def fixed_sizes(self, name: str) -> tuple[int, int, int] | None:
        return fixed_sizes(self.root, name) if _NAME_RE.match(name) else None


class StaticImages:
    """A fixed catalog, for unit tests."""

    def __init__(self, names: list[str] | None = None) -> None:
        self._names = sorted(set(names or []) | set(BUILTIN))

    def names(self) -> list[str]:
        return list(self._names)

    def fixed_sizes(self, name: str) -> tuple[int, int, int] | None:
        return None
