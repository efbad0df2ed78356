"""Debian's cloud kernel, out of its unpacked package: the kernel file (the
uncompressed `vmlinux` cut out of `vmlinuz`, which boots about 0.3 s faster)
and the modules a set of roots needs, in load order (the package's modules
carry no dependency list, only each module's `.modinfo`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.commands import COMMAND_TIMEOUT_S

LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"


def kernel_file(unpacked: Path) -> tuple[str, Path]:
    """(release, vmlinuz) of the kernel package unpacked in `unpacked`."""
    found = sorted((unpacked / "boot").glob("vmlinuz-*"))
    if not found:
        raise ImageError("the kernel package holds no /boot/vmlinuz-*")
    vmlinuz = found[-1]
    return vmlinuz.name.removeprefix("vmlinuz-"), vmlinuz


def uncompressed_kernel(vmlinuz: Path, out: Path) -> Path | None:
    """`vmlinux` cut out of a bzImage at the lz4 magic; None when that fails."""
    if shutil.which("lz4") is None:
        return None
    data = vmlinuz.read_bytes()
    start = data.find(LZ4_LEGACY_MAGIC)
    while start >= 0:
        with out.open("wb") as sink:
            # lz4 complains about the bytes after the stream (exit 1); the output is whole.
            subprocess.run(["lz4", "-dc"], input=data[start:], stdout=sink,  # noqa: S607
                           stderr=subprocess.DEVNULL, check=False, timeout=COMMAND_TIMEOUT_S)
        with out.open("rb") as f:
            if f.read(4) == b"\x7fELF" and out.stat().st_size > len(data):
                return out
        start = data.find(LZ4_LEGACY_MAGIC, start + 1)
    out.unlink(missing_ok=True)
    return None


def module_order(modules_dir: Path, roots: Iterable[str]) -> list[tuple[str, Path]]:
    """The modules `roots` need, dependencies first; built-in ones are left out."""
    index = {p.name.removesuffix(".ko").replace("-", "_"): p
             for p in (modules_dir / "kernel").rglob("*.ko")}
    builtin_file = modules_dir / "modules.builtin"
    builtin = {Path(line).name.removesuffix(".ko").replace("-", "_")
               for line in (builtin_file.read_text().split() if builtin_file.exists() else [])}
    order: list[tuple[str, Path]] = []
    seen: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in seen or name in builtin:
            return
        if name in trail:
            raise ImageError(f"module dependency cycle: {' -> '.join((*trail, name))}")
        path = index.get(name)
        if path is None:
            raise ImageError(f"the kernel has no module {name} (and it is not built in)")
        for dep in module_depends(path):
            visit(dep, (*trail, name))
        seen.add(name)
        order.append((name, path))

    for root in roots:
        visit(root, ())
    return order


def module_depends(path: Path) -> list[str]:
    """The `depends=` of a module's .modinfo section."""
    match = re.search(rb"(?:^|\x00)depends=([^\x00]*)\x00", path.read_bytes())
    if match is None or not match.group(1):
        return []
    return [d.replace("-", "_") for d in match.group(1).decode().split(",") if d]
