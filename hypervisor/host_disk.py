"""The files of the machine a host's libvirt runs on: where libvirt writes a saved
state (virDomainSave) and reads a fork's copy of it, and where a VM's disk and a
snapshot's copy of it are. For a host on this machine they are this machine's
files (`LocalDisk`); for a host elsewhere, the same paths on that machine, reached
over its SSH (rift.guest.host_files.SshDisk).

Every method raises OSError when the host does not do what it is asked.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from pathlib import Path

from hypervisor.base import HostDisk, ImageError
from hypervisor.commands import run_command

__all__ = ["LOCAL_DISK", "HostDisk", "LocalDisk"]  # HostDisk: the port, in base

COPY_TIMEOUT_S = 600
_COPY_CHUNK = 1 << 30
# copy_file_range refusing these means "not here" (another file system, an old
# kernel, a seccomp filter), not a broken file: sendfile copies instead.
_COPY_REFUSED = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                           errno.EPERM})


class LocalDisk:
    """This machine's files."""

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def read_at(self, path: str, offset: int, count: int) -> bytes:
        with open(path, "rb") as f:
            return os.pread(f.fileno(), count, offset)

    def make_dir(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True, mode=0o700)

    def copy_sparse(self, source: str, target: str) -> None:
        try:
            run_command(["cp", "--sparse=always", source, target], timeout_s=COPY_TIMEOUT_S)
        except ImageError as exc:
            raise OSError(errno.EIO, str(exc)) from exc

    def usage(self, folder: str) -> int:
        path = Path(folder)
        if not path.is_dir():
            return 0
        return sum(p.stat().st_blocks * 512 for p in path.iterdir() if p.is_file())

    def free(self, folder: str) -> int:
        path = Path(folder)
        while not path.exists() and path != path.parent:
            path = path.parent
        return shutil.disk_usage(path).free

    def spliced(self, source: str, head: bytes, offset: int, target: str) -> None:
        dst = Path(target)
        partial = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}.part")
        with open(source, "rb") as src:
            count = os.fstat(src.fileno()).st_size - offset
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                try:
                    _write_all(fd, head)
                    _copy_stream(src.fileno(), fd, offset, count)
                finally:
                    os.close(fd)
                os.replace(partial, dst)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise

    def remove(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            Path(path).unlink(missing_ok=True)


LOCAL_DISK = LocalDisk()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy_stream(src: int, dst: int, offset: int, count: int) -> None:
    """Copy `count` bytes of `src` from `offset` to the position of `dst`, in the kernel."""
    use_copy_range = True
    while count > 0:
        chunk = min(count, _COPY_CHUNK)
        if use_copy_range:
            try:
                done = os.copy_file_range(src, dst, chunk, offset)
            except OSError as exc:
                if exc.errno not in _COPY_REFUSED:
                    raise
                use_copy_range = False  # another file system, or an old kernel
                continue
        else:
            done = os.sendfile(dst, src, offset, chunk)
        if done == 0:
            raise OSError(errno.EIO, f"the source ended {count} bytes early")
        offset += done
        count -= done
