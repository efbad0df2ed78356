"""Guests' serial console logs, bounded (SPEC §15: `RIFT_CONSOLE_LOG_MIB`).

Each guest's console goes to `<serial dir>/<vm id>.log`, opened with O_APPEND
(hypervisor.domain_xml: `append='on'`) by libvirtd for QEMU (`stdio_handler =
"file"`) or by virtlogd (`"logd"`, libvirt's default, which also rotates it at
its own `max_size` into `<vm id>.log.0`, `.1`, ...). With O_APPEND the file can
be cut under its writer, whose next write lands at the new end, not past a
hole. The keeper looks at every log each second: one over the cap loses its
head and keeps its newest quarter (fallocate's COLLAPSE_RANGE, atomic against
the writer's appends, where the filesystem has it: ext4, xfs), or is emptied
where it has not; virtlogd's rotated copies are removed (nobody reads them).
Logs on hosts elsewhere are cut the same way by one shell command per host,
every `remote_every_s`. A guest flooding its console at the speed TCG allows
(about 0.1 MB/s measured here) overshoots the cap by what it writes in a second.

Readers take only a log's tail (`read_tail`), never the whole file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MIB = 1 << 20
TAIL_BYTES = 64 * 1024  # what a reader of a console takes from its end
_FALLOC_FL_COLLAPSE_RANGE = 0x08
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


def read_tail(path: Path, count: int = TAIL_BYTES) -> bytes | None:
    """The last `count` bytes of the file; None when it is not there."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - count))
            return f.read(count)
    except FileNotFoundError:
        return None


def cut(path: Path, cap_bytes: int) -> bool:
    """Bring the file under `cap_bytes` if it is over: its head goes, a quarter
    of the cap (rounded to the filesystem's blocks) stays. True when it was cut."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False  # gone meanwhile
    try:
        seen = os.fstat(fd)
        if seen.st_size <= cap_bytes:
            return False
        block = max(seen.st_blksize, 4096)
        drop = (seen.st_size - cap_bytes // 4) // block * block
        if drop > 0 and _libc.fallocate(fd, _FALLOC_FL_COLLAPSE_RANGE, 0, drop) == 0:
            return True
        err = ctypes.get_errno()
        if err not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, 0):
            log.info("collapsing %s failed (%s): emptying it", path, os.strerror(err))
        os.ftruncate(fd, 0)
        return True
    finally:
        os.close(fd)


def cut_command(folder: str, cap_bytes: int) -> str:
    """The shell command that does `cut` to every log in `folder` on a host elsewhere
    (util-linux's `fallocate --collapse-range`, else `truncate`)."""
    keep = cap_bytes // 4
    return (f"cd {_quote(folder)} 2>/dev/null || exit 0; "
            f"for f in $(find . -maxdepth 1 -type f -name '*.log' -size +{cap_bytes}c); do "
            f"s=$(stat -c %s \"$f\") && d=$(( (s - {keep}) / 4096 * 4096 )) && "
            f"{{ fallocate --collapse-range -o 0 -l \"$d\" \"$f\" 2>/dev/null || "
            f"truncate -s 0 \"$f\"; }}; done; "
            f"find . -maxdepth 1 -type f -name '*.log.[0-9]*' -delete; true")


def _rotated(name: str) -> bool:
    """Whether `name` is one of virtlogd's rotated copies of a log (`x.log.0`)."""
    stem, dot, number = name.rpartition(".")
    return bool(dot) and stem.endswith(".log") and number.isdigit()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


class ConsoleKeeper:
    """Keeps every `*.log` in `serial_dir` (and, through `remote`, in the same folder
    on each host elsewhere Rift is connected to) under `cap_bytes`."""

    def __init__(self, serial_dir: Path, cap_bytes: int, *, interval_s: float = 1.0,
                 remote: Callable[[str], None] | None = None,
                 remote_every_s: float = 10.0) -> None:
        self.serial_dir = serial_dir
        self.cap_bytes = cap_bytes
        self.interval_s = interval_s
        self.remote = remote  # runs a shell command on each host elsewhere
        self.remote_every = max(1, round(remote_every_s / interval_s))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._warned = False  # a log that cannot be cut is said once, not every second

    def sweep(self) -> int:
        """Cut the logs here that are over the cap; how many were."""
        cut_count = 0
        try:
            entries = list(os.scandir(self.serial_dir))
        except OSError:
            return 0
        for entry in entries:
            try:
                if _rotated(entry.name):
                    os.unlink(entry.path)
                    continue
                if (entry.name.endswith(".log") and entry.is_file(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_size > self.cap_bytes
                        and cut(Path(entry.path), self.cap_bytes)):
                    cut_count += 1
                    log.info("a guest's console log went over its cap and was cut",
                             extra={"file": entry.name, "cap_bytes": self.cap_bytes})
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("a guest's console log cannot be cut: %s", exc,
                                extra={"file": entry.name})
        return cut_count

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rift-console-keeper",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(5.0)

    def _run(self) -> None:
        rounds = 0
        remote: threading.Thread | None = None
        while not self._stop.wait(self.interval_s):
            self.sweep()
            rounds += 1
            due = self.remote is not None and rounds % self.remote_every == 0
            if due and (remote is None or not remote.is_alive()):
                # on a thread of its own: a host that stalls holds up no sweep here
                remote = threading.Thread(target=self._cut_remote, daemon=True,
                                          name="rift-console-keeper-hosts")
                remote.start()

    def _cut_remote(self) -> None:
        assert self.remote is not None
        try:
            self.remote(cut_command(str(self.serial_dir), self.cap_bytes))
        except Exception:  # a host that does not answer is the sweep's to report
            log.debug("cutting console logs on hosts elsewhere failed", exc_info=True)
