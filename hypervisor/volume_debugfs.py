"""The helper process of hypervisor.volume_content (`python -m
hypervisor.volume_debugfs`): one JSON request on stdin ({op, file, path, ...}), one
JSON answer on stdout ({ok} or {fault, message}).

The volume's qcow2 is exported as a raw image by `qemu-storage-daemon` (a FUSE
export onto an empty file in a private temporary folder: no kernel mount of the
file system, no loop device), and its ext4 is read and changed by `debugfs`
(e2fsprogs, in user space). The export is opened, used and closed within the call.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hypervisor.base import ImageError
from hypervisor.volume_content import FAULTS, Entry, Meta

DAEMON = "qemu-storage-daemon"  # QEMU's, exporting the volume's image as raw bytes
EXPORT_WAIT_S = 10.0
DEBUGFS_TIMEOUT_S = 300
MAX_DEPTH = 16
_MISSING = "File not found by ext2_lookup"
_TYPES = {"regular": "file", "directory": "directory", "symlink": "symlink"}
_TIME = re.compile(r"^\s*(a|m|c)time: 0x([0-9a-f]+)", re.MULTILINE)




class Steps:
    """A volume's files on this machine, in this process (the helper's: see
    `VolumeContent`)."""

    def list(self, volume_file: str, path: str, depth: int) -> list[Entry]:
        with _exported(volume_file, writable=False) as raw:
            top = _stat(raw, path)
            if top.type != "directory":
                raise NotADirectoryError(path)
            found: list[Entry] = []
            _walk(raw, path, max(1, min(depth, MAX_DEPTH)), found)
            return found

    def stat(self, volume_file: str, path: str) -> Entry:
        with _exported(volume_file, writable=False) as raw:
            return _stat(raw, path)

    def read(self, volume_file: str, path: str) -> bytes:
        with _exported(volume_file, writable=False) as raw:
            if _stat(raw, path).type == "directory":
                raise IsADirectoryError(path)
            return _debugfs(raw, [f'cat "{path}"'])

    def write(self, volume_file: str, path: str, data: bytes, owner: Meta,
              ) -> Entry:
        with _exported(volume_file, writable=True) as raw:
            _check_clean(raw)
            there = _maybe(raw, path)
            if there is not None and there.type == "directory":
                raise IsADirectoryError(path)
            if there is not None and not owner.force:
                raise FileExistsError(path)
            _folder(raw, posixpath.dirname(path))
            with tempfile.NamedTemporaryFile(prefix="rift-volume-") as f:
                f.write(data)
                f.flush()
                steps = ([f'rm "{path}"'] if there is not None else []) + \
                    [f'write "{f.name}" "{path}"']
                _debugfs(raw, steps, writable=True)
            _own(raw, path, owner, 0o100000, 0o644 if there is None else there.mode)
            return _stat(raw, path)

    def make_dir(self, volume_file: str, path: str, owner: Meta) -> Entry:
        with _exported(volume_file, writable=True) as raw:
            _check_clean(raw)
            there = _maybe(raw, path)
            if there is not None:
                if not owner.force or there.type != "directory":
                    raise FileExistsError(path)
                return there
            parent = posixpath.dirname(path)
            missing = []
            while parent != "/" and _maybe(raw, parent) is None:
                if not owner.force:
                    raise FileNotFoundError(parent)
                missing.append(parent)
                parent = posixpath.dirname(parent)
            _folder(raw, parent)
            for folder in [*reversed(missing), path]:
                _debugfs(raw, [f'mkdir "{folder}"'], writable=True)
                _own(raw, folder, owner, 0o040000, 0o755)
            return _stat(raw, path)

    def set_meta(self, volume_file: str, path: str, owner: Meta) -> Entry:
        with _exported(volume_file, writable=True) as raw:
            _check_clean(raw)
            there = _stat(raw, path)
            kind = {"file": 0o100000, "directory": 0o040000, "symlink": 0o120000}[there.type]
            _own(raw, path, owner, kind, there.mode)
            return _stat(raw, path)

    def remove(self, volume_file: str, path: str) -> None:
        with _exported(volume_file, writable=True) as raw:
            _check_clean(raw)
            there = _stat(raw, path)
            if path == "/":
                raise FileNotFoundError(path)  # the volume's root stays
            steps: list[str] = []
            if there.type == "directory":
                inside: list[Entry] = []
                _walk(raw, path, MAX_DEPTH, inside)
                for entry in reversed(inside):  # deepest first
                    verb = "rmdir" if entry.type == "directory" else "rm"
                    steps.append(f'{verb} "{entry.path}"')
                steps.append(f'rmdir "{path}"')
            else:
                steps.append(f'rm "{path}"')
            _debugfs(raw, steps, writable=True)


# -- the export --------------------------------------------------------------------------

@contextmanager
def _exported(volume_file: str, *, writable: bool) -> Iterator[str]:
    """The volume as a raw image at a private path while the block runs."""
    if not os.path.isfile(volume_file):
        raise ImageError(f"the volume's file {volume_file} is not on this machine")
    with tempfile.TemporaryDirectory(prefix="rift-volume-export-") as folder:
        raw = Path(folder) / "volume.raw"
        raw.touch(mode=0o600)
        daemon = subprocess.Popen(  # noqa: S603 - fixed arguments, no shell
            [DAEMON,
             "--blockdev", f"driver=file,filename={_blockdev(volume_file)},node-name=f"
                           f"{'' if writable else ',read-only=on'}",
             "--blockdev", f"driver=qcow2,file=f,node-name=q{'' if writable else ',read-only=on'}",
             "--export", f"type=fuse,id=e,node-name=q,mountpoint={raw},"
                         f"writable={'on' if writable else 'off'}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_export(daemon, raw)
            yield str(raw)
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def _blockdev(path: str) -> str:
    if "," in path:
        raise ImageError(f"a volume's file name may not hold a comma: {path}")
    return path


def _wait_export(daemon: subprocess.Popen[bytes], raw: Path) -> None:
    deadline = time.monotonic() + EXPORT_WAIT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            said = daemon.stderr.read().decode(errors="replace") if daemon.stderr else ""
            raise OSError(f"the volume could not be opened: {said.strip()[-300:]}")
        if raw.stat().st_size > 0:
            return
        time.sleep(0.01)
    raise OSError("the volume's export did not start")


# -- debugfs -----------------------------------------------------------------------------

def _debugfs(raw: str, steps: list[str], *, writable: bool = False) -> bytes:
    """Run `steps` in one debugfs; its output. FileNotFoundError for a path a step
    did not find, OSError for any other complaint."""
    with tempfile.NamedTemporaryFile("w", prefix="rift-debugfs-", suffix=".cmds") as cmds:
        cmds.write("\n".join(steps) + "\n")
        cmds.flush()
        args = ["debugfs", *(["-w"] if writable else []), "-f", cmds.name, raw]
        if len(steps) == 1:
            args = ["debugfs", *(["-w"] if writable else []), "-R", steps[0], raw]
        done = subprocess.run(args, capture_output=True, timeout=DEBUGFS_TIMEOUT_S,  # noqa: S603
                              check=False)
    said = [line for line in done.stderr.decode(errors="replace").splitlines()
            if line.strip() and not line.startswith("debugfs ")]
    if any(_MISSING in line for line in said):
        raise FileNotFoundError(said[0].split(":")[0])
    if any("is not a directory" in line for line in said):
        raise NotADirectoryError(said[0].split(":")[0])
    if said or done.returncode != 0:
        raise OSError(f"debugfs: {'; '.join(said)[-300:] or done.returncode}")
    return done.stdout


def _maybe(raw: str, path: str) -> Entry | None:
    try:
        return _stat(raw, path)
    except FileNotFoundError:
        return None


def _stat(raw: str, path: str) -> Entry:
    out = _debugfs(raw, [f'stat "{path}"']).decode(errors="replace")
    head = re.search(r"Type: (\w+)\s+Mode:\s+(\d+)", out)
    owner = re.search(r"User:\s+(\d+)\s+Group:\s+(\d+).*?Size: (\d+)", out)
    if head is None or owner is None:
        raise OSError(f"debugfs answered no stat of {path}")
    times = {kind: int(value, 16) for kind, value in _TIME.findall(out)}
    target = re.search(r'Fast link dest: "(.*)"', out)
    return Entry(name=posixpath.basename(path) or "/", type=_TYPES.get(head.group(1), "file"),
                 path=path, size=int(owner.group(3)), mode=int(head.group(2), 8),
                 uid=int(owner.group(1)), gid=int(owner.group(2)), atime=times.get("a", 0),
                 mtime=times.get("m", 0), ctime=times.get("c", 0),
                 target=target.group(1) if target else None)


def _walk(raw: str, path: str, depth: int, found: list[Entry]) -> None:
    """Append the entries under the folder `path`, `depth` levels down, parents first."""
    listed = _debugfs(raw, [f'ls -p "{path}"']).decode(errors="replace")
    for line in listed.splitlines():
        parts = line.split("/")
        name = "/".join(parts[5:-2]) if len(parts) >= 8 else ""
        if not name or name in (".", "..") or parts[1] == "0":  # a free slot, or itself
            continue
        child = posixpath.join(path, name)
        entry = _stat(raw, child)
        found.append(entry)
        if entry.type == "directory" and depth > 1:
            _walk(raw, child, depth - 1, found)


def _folder(raw: str, path: str) -> None:
    there = _stat(raw, path)  # FileNotFoundError when it is not there
    if there.type != "directory":
        raise NotADirectoryError(path)


def _own(raw: str, path: str, owner: Meta, kind: int, mode: int) -> None:
    """Set the mode (with `kind`'s type bits), uid and gid `owner` asks for."""
    bits = (owner.mode if owner.mode is not None else mode) & 0o7777
    steps = [f'sif "{path}" mode 0{kind | bits:o}']
    if owner.uid is not None:
        steps.append(f'sif "{path}" uid {int(owner.uid)}')
    if owner.gid is not None:
        steps.append(f'sif "{path}" gid {int(owner.gid)}')
    _debugfs(raw, steps, writable=True)


def _check_clean(raw: str) -> None:
    """OSError when the journal holds what a guest's mount must replay first."""
    out = _debugfs(raw, ["stats"]).decode(errors="replace")
    features = next((line for line in out.splitlines()
                     if line.startswith("Filesystem features:")), "")
    if "needs_recovery" in features.split():
        raise OSError("the volume's journal needs replaying: attach it to a VM once "
                      "(a writable mount replays it), detach it, and call again")


def _serve(asked: dict[str, Any]) -> Any:
    steps, op, file, path = Steps(), asked["op"], asked["file"], asked["path"]
    meta = Meta(**asked["meta"]) if "meta" in asked else Meta()
    if op == "list":
        return [asdict(e) for e in steps.list(file, path, int(asked["depth"]))]
    if op == "read":
        return base64.b64encode(steps.read(file, path)).decode()
    if op == "write":
        return asdict(steps.write(file, path, base64.b64decode(asked["data"]), meta))
    if op == "remove":
        steps.remove(file, path)
        return None
    done = {"stat": lambda: steps.stat(file, path),
            "make_dir": lambda: steps.make_dir(file, path, meta),
            "set_meta": lambda: steps.set_meta(file, path, meta)}[op]()
    return asdict(done)


def main() -> int:
    try:
        answer: dict[str, Any] = {"ok": _serve(json.loads(sys.stdin.buffer.read()))}
    except ImageError as exc:
        answer = {"fault": "image", "message": str(exc)}
    except OSError as exc:
        kind = next((k for k, v in FAULTS.items() if type(exc) is v), "os")
        answer = {"fault": kind, "message": str(exc)}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
