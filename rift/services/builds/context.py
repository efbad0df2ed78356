"""A build's context (SPEC §19): the folder a recipe's COPY sources are read from.

Every source must lie inside the context once symbolic links are followed, and
exist: otherwise `build_failed` naming its line, before any VM starts. What a COPY
copies is digested (paths, modes and bytes, in order) for its layer's key, and
packed as one tar whose member names are the paths in the guest, so the guest
unpacks it at `/` in one step. A REST build's context comes as a tar, unpacked
here into a folder of the build's (data only: no links out, no devices). Every
door's context (the CLI's `--context DIR`, REST's tar, the E2B door's uploads) is
held to RIFT_BUILD_CONTEXT_MIB by `Context.check_size`, which the builder calls
before any VM starts: the same refusal (`invalid_argument` on `context`) from each.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
from collections.abc import Iterator
from pathlib import Path

from rift.domain.errors import BuildFailed, InvalidArgument
from rift.domain.recipes import Copy

MIB = 1024 * 1024
CONTEXTS = "build-contexts"  # in the data folder: the contexts doors unpack, one a build


def context_folder(data_dir: Path, build_id: str) -> Path:
    """A new folder for build `build_id`'s context (REST's tar, the E2B door's
    uploads), named after it so a restart that cuts the build removes it
    (rift.services.builds.restarts)."""
    folder = data_dir / CONTEXTS / build_id
    folder.mkdir(parents=True)
    return folder


class Context:
    """The folder COPY reads from; None when the recipe was given none (then any
    COPY is refused)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root.resolve() if root is not None else None

    def check_size(self, limit_mib: int) -> None:
        """invalid_argument when the folder's files (symbolic links not followed) add
        up to more than `limit_mib`; reads no further than the limit."""
        if self.root is None:
            return
        total, limit = 0, limit_mib * MIB
        for dirpath, _, filenames in os.walk(self.root):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    total += os.lstat(path).st_size
                if total > limit:
                    raise InvalidArgument("context", f"the context is over "
                                          f"RIFT_BUILD_CONTEXT_MIB ({limit_mib} MiB); "
                                          "leave out what the recipe does not COPY")

    def _source(self, line: int, source: str) -> Path:
        if self.root is None:
            raise BuildFailed(f"COPY {source}: this build has no context (--context DIR)", line)
        path = (self.root / source).resolve()
        if path != self.root and self.root not in path.parents:
            raise BuildFailed(f"COPY {source} is outside the build context", line)
        if not path.exists():
            raise BuildFailed(f"COPY {source}: no such file or folder in the context", line)
        return path

    def files(self, line: int, copy: Copy) -> list[tuple[Path, str]]:
        """Each file and folder the COPY copies, with its path in the guest, in order;
        build_failed (naming `line`) for a source outside the context or missing."""
        into_folder = copy.dest.endswith("/") or len(copy.sources) > 1
        found: list[tuple[Path, str]] = []
        for source in copy.sources:
            path = self._source(line, source)
            if path.is_dir():
                found.extend(self._walk(line, path, copy.dest.rstrip("/") or "/"))
            else:
                target = (posixpath.join(copy.dest, path.name) if into_folder else copy.dest)
                found.append((path, target))
        return found

    def _walk(self, line: int, folder: Path, dest: str) -> Iterator[tuple[Path, str]]:
        yield folder, dest
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in [*dirnames, *sorted(filenames)]:
                path = Path(dirpath) / name
                real = path.resolve()
                if self.root is not None and self.root not in real.parents:
                    raise BuildFailed(f"COPY {path.relative_to(self.root)} links outside "
                                      "the build context", line)
                rel = path.relative_to(folder).as_posix()
                yield path, posixpath.join(dest, rel)

    def digest(self, line: int, copy: Copy) -> str:
        """The digest of what the COPY copies: each path in the guest, its mode and bytes."""
        h = hashlib.sha256()
        for path, target in self.files(line, copy):
            h.update(f"{target}\0{path.stat().st_mode:o}\0".encode())
            if path.is_file():
                with path.open("rb") as f:
                    for chunk in iter(lambda: f.read(MIB), b""):
                        h.update(chunk)
            h.update(b"\0")
        return h.hexdigest()

    def pack(self, line: int, copy: Copy) -> bytes:
        """A tar of what the COPY copies, its member names the guest's paths."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path, target in self.files(line, copy):
                info = tar.gettarinfo(str(path), arcname=target.lstrip("/") or ".")
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if path.is_file():
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        return buffer.getvalue()


def unpack(archive: bytes, into: Path, limit_mib: int) -> Context:
    """A context given as a tar (REST): unpacked into `into` (data only) and answered;
    invalid_argument for one over `limit_mib` or not a tar."""
    if len(archive) > limit_mib * MIB:
        raise InvalidArgument("context", f"the context is over RIFT_BUILD_CONTEXT_MIB "
                              f"({limit_mib} MiB)")
    into.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            total = sum(m.size for m in tar.getmembers())
            if total > limit_mib * MIB:
                raise InvalidArgument("context", f"the unpacked context is over "
                                      f"RIFT_BUILD_CONTEXT_MIB ({limit_mib} MiB)")
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise InvalidArgument("context", f"the context is no tar this builder can take: "
                              f"{exc}") from exc
    return Context(into)
