"""A detached volume's files, read and written on its host with no guest (SPEC §16,
§18: E2B's volume content API): the engine's VolumeContent port, for the volumes
whose files are on this machine.

Each call runs in a helper process of its own (`python -m hypervisor.volume_debugfs`,
a JSON request in and answer out), which exports the volume's qcow2 as raw bytes
(`qemu-storage-daemon`, FUSE) and reads and changes its ext4 with `debugfs` (user
space: a file system a guest wrote is never parsed by this machine's kernel, nor by
the server's own process). The server forks once per call and never beside a FUSE
mount of its own (a fork of `rift serve` beside one was seen to hang). QEMU's image
locks keep a VM from opening the file meanwhile (its attach fails and is undone),
and the helper from opening one a VM holds.

Answers `Entry`; FileNotFoundError for a path that is not there, FileExistsError for
one that is and may not be, NotADirectoryError / IsADirectoryError for the wrong
kind, OSError for a volume whose journal needs a guest's replay (before a write) or
tools that fail, ImageError for a host elsewhere (here; rift.guest.host_volume_content
runs the same helper there, over the host's SSH).
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from hypervisor.base import ImageError, elsewhere

_SAFE = re.compile(r"[^\x00-\x1f\x7f\"\\]+")  # what a debugfs argument may hold


@dataclass(frozen=True)
class Entry:
    name: str
    type: str  # file, directory or symlink
    path: str
    size: int
    mode: int  # its permission bits
    uid: int
    gid: int
    atime: int  # seconds since the epoch
    mtime: int
    ctime: int
    target: str | None = None  # a symlink's


def clean_path(path: str) -> str:
    """`path` made absolute and normal, in the volume; ValueError for what debugfs
    could not be given."""
    normal = posixpath.normpath("/" + path.strip().lstrip("/"))  # never POSIX's "//x"
    if normal != "/" and not _SAFE.fullmatch(normal):
        raise ValueError("letters, digits and printable characters other than \" and \\")
    return normal


@dataclass(frozen=True)
class Meta:
    """What a write, a new folder or a change of metadata sets (None: as it is, or
    for a new one: 0, 0 and 0644 or 0755), and `force`: a write overwrites a file
    there, a new folder makes its missing parents (and one there already is fine)."""

    uid: int | None = None
    gid: int | None = None
    mode: int | None = None
    force: bool = False


FAULTS: dict[str, type[OSError]] = {
    "missing": FileNotFoundError, "exists": FileExistsError,
    "not_dir": NotADirectoryError, "is_dir": IsADirectoryError, "os": OSError}
HELPER_TIMEOUT_S = 600


class VolumeContent:
    """A volume's files on its host (the engine's VolumeContent port), for the
    volumes whose files are on this machine: each call a helper process."""

    def list(self, uri: str, volume_file: str, path: str, depth: int) -> list[Entry]:
        found = self._helper("list", uri, volume_file, path, depth=depth)
        return [Entry(**e) for e in found]

    def stat(self, uri: str, volume_file: str, path: str) -> Entry:
        return Entry(**self._helper("stat", uri, volume_file, path))

    def read(self, uri: str, volume_file: str, path: str) -> bytes:
        return base64.b64decode(self._helper("read", uri, volume_file, path))

    def write(self, uri: str, volume_file: str, path: str, data: bytes, owner: Meta,
              ) -> Entry:
        return Entry(**self._helper("write", uri, volume_file, path, meta=asdict(owner),
                                    data=base64.b64encode(data).decode()))

    def make_dir(self, uri: str, volume_file: str, path: str, owner: Meta) -> Entry:
        return Entry(**self._helper("make_dir", uri, volume_file, path, meta=asdict(owner)))

    def set_meta(self, uri: str, volume_file: str, path: str, owner: Meta) -> Entry:
        return Entry(**self._helper("set_meta", uri, volume_file, path, meta=asdict(owner)))

    def remove(self, uri: str, volume_file: str, path: str) -> None:
        self._helper("remove", uri, volume_file, path)

    def _helper(self, op: str, uri: str, volume_file: str, path: str, **more: Any) -> Any:
        asked = json.dumps({"op": op, "file": volume_file, "path": path, **more}).encode()
        return answer_of(*self.run_helper(uri, asked))

    def run_helper(self, uri: str, asked: bytes) -> tuple[bytes, str]:
        """The helper's stdout for request `asked`, and what it said on stderr: a
        process here (ImageError for a host elsewhere: rift.guest.host_volume_content
        runs it there)."""
        if elsewhere(uri):
            raise ImageError(f"a volume's files without a VM are read here only, not on {uri}")
        done = subprocess.run([sys.executable, "-m", "hypervisor.volume_debugfs"],
                              input=asked, capture_output=True, timeout=HELPER_TIMEOUT_S,
                              check=False)
        return done.stdout, done.stderr.decode(errors="replace") or f"exit {done.returncode}"


def answer_of(stdout: bytes, said: str) -> Any:
    """The helper's answer (`ok`), or its fault raised."""
    try:
        answer = json.loads(stdout)
    except ValueError as exc:
        raise OSError(f"the volume's helper failed: {said.strip()[-300:]}") from exc
    if "fault" in answer:
        if answer["fault"] == "image":
            raise ImageError(answer["message"])
        raise FAULTS.get(answer["fault"], OSError)(answer["message"])
    return answer["ok"]
