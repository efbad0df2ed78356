"""Finding a built kernel image's files (`tiny`, `debian`): the kernel, the
initramfs, the base of the kernel command line and, for an image with a root
disk (`debian`), its read-only base disk, as its manifest names them.

Layout of `<images dir>/<name>/`: `vmlinux` (or `vmlinuz` when the uncompressed
kernel could not be cut out), `initrd.img`, `manifest.json`, and `root.qcow2`
where the manifest names a `disk`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hypervisor.base import ImageError


@dataclass(frozen=True)
class ImageFiles:
    """What a domain needs to boot an image."""

    name: str
    kernel: Path
    initrd: Path
    cmdline_base: str
    disk: Path | None = None  # the read-only base of each VM's overlay (qcow2)
    disk_bytes: int = 0  # its virtual size


def image_files(images_dir: Path, name: str) -> ImageFiles:
    """The files of a built image, read from its manifest; ImageError when not built."""
    folder = images_dir / name
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        kernel = folder / str(manifest["kernel"]["file"])
        initrd = folder / str(manifest["initrd"]["file"])
        cmdline = str(manifest["cmdline_base"])
        disk_facts = manifest.get("disk")
        disk = None if disk_facts is None else folder / str(disk_facts["file"])
        disk_bytes = 0 if disk_facts is None else int(disk_facts["virtual_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"image {name!r} is not built in {images_dir} ({exc}); "
                         f"`rift image build {name}` builds it") from exc
    for path in (kernel, initrd, disk):
        if path is not None and not path.is_file():
            raise ImageError(f"image {name!r} lacks {path}; `rift image build {name}` rebuilds it")
    return ImageFiles(name=name, kernel=kernel.resolve(), initrd=initrd.resolve(),
                      cmdline_base=cmdline, disk=None if disk is None else disk.resolve(),
                      disk_bytes=disk_bytes)
