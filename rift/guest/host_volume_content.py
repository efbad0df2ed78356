"""A detached volume's files on a host elsewhere, with no guest (SPEC §16, §18: E2B's
volume content API): the same helper as for this machine's volumes
(hypervisor.volume_debugfs: `qemu-storage-daemon` exports the qcow2 raw onto a
private file, `debugfs` reads and changes its ext4), run on the volume's host over
its SSH, so the volume's bytes stay there and only the request and the answer
cross (a file of at most MAX_CONTENT, in base64).

The helper goes there as one zip of its three modules (`python3 FILE.pyz`, with
nothing of Rift installed there), built here once in `tools_dir` and copied to the
same path there (checked by sha256, copied again only when it changed, as an
image's files are). A host needs what this machine needs for its own volumes:
python3, qemu-storage-daemon (QEMU's system package), debugfs (e2fsprogs) and FUSE
(a host whose SSH user is not root: fuse3's fusermount3).
"""

from __future__ import annotations

import shlex
import zipfile
from pathlib import Path

import hypervisor
from hypervisor.base import ImageError
from hypervisor.volume_content import HELPER_TIMEOUT_S, VolumeContent
from rift.guest.links import HostLinkError, HostLinks, ssh_target

MODULES = ("base.py", "volume_content.py", "volume_debugfs.py")
MAIN = "from hypervisor.volume_debugfs import main\nraise SystemExit(main())\n"
FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # the same bytes from the same sources


def build_helper(into: Path) -> Path:
    """The helper as one zip file at `into` (made again only when its bytes change)."""
    source = Path(hypervisor.__file__).parent
    parts = [("__main__.py", MAIN.encode()), ("hypervisor/__init__.py", b"")]
    parts += [(f"hypervisor/{name}", (source / name).read_bytes()) for name in MODULES]
    partial = into.with_name(into.name + ".partial")
    into.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name, data in parts:
            zipped.writestr(zipfile.ZipInfo(name, FIXED_TIME), data)
    if into.is_file() and into.read_bytes() == partial.read_bytes():
        partial.unlink()
    else:
        partial.replace(into)
    return into


class HostVolumeContent(VolumeContent):
    """The VolumeContent port over every host: this machine's helper process, or the
    same helper on a host elsewhere over its SSH."""

    def __init__(self, links: HostLinks, tools_dir: Path) -> None:
        self.links = links
        self.tools_dir = tools_dir
        self._helper_file: Path | None = None

    def run_helper(self, uri: str, asked: bytes) -> tuple[bytes, str]:
        target = ssh_target(uri)
        if target is None:
            return super().run_helper(uri, asked)
        if self._helper_file is None:
            self._helper_file = build_helper(self.tools_dir / "rift-volume-helper.pyz")
        try:
            self.links.ensure_file(target, self._helper_file)
            command = f"python3 {shlex.quote(str(self._helper_file))}"
            return self.links.run_bytes(target, command, stdin=asked,
                                        timeout_s=HELPER_TIMEOUT_S), ""
        except HostLinkError as exc:
            raise ImageError(f"the volume's helper on {target.host} failed: {exc}") from exc
