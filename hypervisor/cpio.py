"""A newc cpio archive (what the kernel unpacks as its initramfs), built in
memory: root-owned entries and fixed times, so the same inputs give the same
bytes."""

from __future__ import annotations

import stat

MTIME = 0  # a fixed mtime in the archive: the same inputs give the same bytes


class Archive:
    """A newc cpio archive in memory, with root-owned entries and fixed times."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, bytes, int, int]] = {}  # path -> mode, data, rdev

    def directory(self, path: str, mode: int = 0o755) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in self._entries:
                self._entries[parent] = (stat.S_IFDIR | 0o755, b"", 0, 0)
        self._entries[path.strip("/")] = (stat.S_IFDIR | mode, b"", 0, 0)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._parent(path)
        self._entries[path.strip("/")] = (stat.S_IFREG | mode, data, 0, 0)

    def symlink(self, path: str, target: str) -> None:
        self._parent(path)
        self._entries[path.strip("/")] = (stat.S_IFLNK | 0o777, target.encode(), 0, 0)

    def char_device(self, path: str, major: int, minor: int, mode: int = 0o600) -> None:
        self._parent(path)
        self._entries[path.strip("/")] = (stat.S_IFCHR | mode, b"", major, minor)

    def _parent(self, path: str) -> None:
        parent = path.strip("/").rpartition("/")[0]
        if parent and parent not in self._entries:
            self.directory(parent)

    def finish(self) -> bytes:
        chunks: list[bytes] = []
        for ino, path in enumerate(sorted(self._entries), start=1):
            mode, data, major, minor = self._entries[path]
            chunks.append(_newc(path, ino, mode, data, (major, minor)))
        chunks.append(_newc("TRAILER!!!", 0, 0, b"", (0, 0)))
        return b"".join(chunks)


def _newc(name: str, ino: int, mode: int, data: bytes, device: tuple[int, int]) -> bytes:
    """One entry in the newc format; `device` is a device node's (major, minor)."""
    major, minor = device
    encoded = name.encode() + b"\x00"
    nlink = 2 if stat.S_ISDIR(mode) else 1
    fields = (ino, mode, 0, 0, nlink, MTIME, len(data), 0, 0, major, minor, len(encoded), 0)
    header = b"070701" + b"".join(b"%08X" % v for v in fields)
    head = header + encoded
    head += b"\x00" * (-len(head) % 4)
    return head + data + b"\x00" * (-len(data) % 4)
