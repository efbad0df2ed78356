"""Debian packages a recipe installs from local files (SPEC §19), for guests that
reach no mirror: the host's own apt fetches the packages and every package they
need that the `debian` image lacks (`fetch`), and a build's context gets them as
`debs/` beside the operator's files (`context_with`), which the recipe copies in
and installs offline (`apt-get install /tmp/debs/*.deb`).

What `debian` has is its root's dpkg status (the debootstrapped root the image
was made from, `<images>/.cache/roots/<key>/`, its key in the image's manifest):
apt resolves the packages against that status, not the host's, with its own
archives folder (`apt-get install --download-only`, private status and
extended states, no recommends), so the set is exactly what a `debian` guest
would download. The set is kept machine-wide in the images' cache
(`<images>/.cache/recipe-debs/<key>/debs/`), its key a digest of the packages,
that status and the host's apt lists' Release files (a mirror's new release
makes a new set); a set is made in a work folder and renamed whole, so a set
there is complete. Nothing but the host's package registry is asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.commands import run_command
from hypervisor.manifest import MANIFEST, digest

APT_LISTS = Path("/var/lib/apt/lists")
SETS = "recipe-debs"  # in the images' cache: one folder a set of packages
FETCH_TIMEOUT_S = 1800
Run = Callable[..., str]


def base_status(images_dir: Path, base: str = "debian") -> Path:
    """The dpkg status of the root `base` (made as `debian` is) was built from;
    ImageError naming what builds it when it is not there."""
    manifest = images_dir / base / MANIFEST
    try:
        key = str(json.loads(manifest.read_text())["disk"]["root"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"{manifest} names no Debian root; rift image build {base} "
                         "makes it") from exc
    status = cache_of(images_dir, base) / "roots" / key / "var" / "lib" / "dpkg" / "status"
    if not status.is_file():
        raise ImageError(f"the Debian root of {base} ({key}) is not in {status.parents[3]}; "
                         f"rift image build {base} makes it again")
    return status


def cache_of(images_dir: Path, base: str = "debian") -> Path:
    """The cache `base` was built beside (its folder may be a link to another images
    folder's, as the tests' servers have): where its root is, and the sets go."""
    return (images_dir / base).resolve().parent / ".cache"


def lists_digest(lists: Path = APT_LISTS) -> str:
    """A digest of the host's apt lists' Release files (which mirror, which release)."""
    h = hashlib.sha256()
    for path in sorted(lists.glob("*Release")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def set_key(packages: Iterable[str], status: Path, lists: Path = APT_LISTS) -> str:
    """The name of a set's folder: the packages (in any order), the base's status and
    the lists."""
    made_of = {"packages": sorted(set(packages)),
               "status": hashlib.sha256(status.read_bytes()).hexdigest(),
               "lists": lists_digest(lists)}
    return digest(json.dumps(made_of, sort_keys=True).encode()).removeprefix("sha256:")[:16]


def apt_argv(packages: Iterable[str], status: Path, work: Path) -> list[str]:
    """`apt-get install --download-only` against `status`, into `work/debs`."""
    return ["apt-get", "-q", "-y", "--download-only", "--no-install-recommends",
            "-o", f"Dir::State::status={status}",
            "-o", f"Dir::State::extended_states={work / 'extended_states'}",
            "-o", f"Dir::Cache::archives={work / 'debs'}",
            "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root",
            "install", *sorted(set(packages))]


def fetch(packages: Iterable[str], status: Path, cache: Path, *,
          lists: Path = APT_LISTS, run: Run = run_command) -> Path:
    """The folder of .debs installing `packages` where `status` is installed: from
    the cache, or fetched there by the host's apt (its lists updated once when a
    fetch fails: a mirror moved on)."""
    wanted = sorted(set(packages))
    if not wanted:
        raise ImageError("no packages named")
    key = set_key(wanted, status, lists)
    sets = cache / SETS
    done = sets / key
    if (done / "debs").is_dir():
        return done / "debs"
    sets.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=sets))
    try:
        (work / "debs" / "partial").mkdir(parents=True)
        argv = apt_argv(wanted, status, work)
        try:
            run(argv, timeout_s=FETCH_TIMEOUT_S)
        except ImageError:
            run(["apt-get", "update", "-qq"], timeout_s=FETCH_TIMEOUT_S)
            run(argv, timeout_s=FETCH_TIMEOUT_S)
        shutil.rmtree(work / "debs" / "partial")
        (work / "debs" / "lock").unlink(missing_ok=True)
        if not any((work / "debs").glob("*.deb")):
            raise ImageError(f"{', '.join(wanted)}: the base has them all; install "
                             "nothing from debs/")
        (work / "packages").write_text("".join(f"{p}\n" for p in wanted))
        with contextlib.suppress(OSError):  # another fetch made the same set first
            work.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done / "debs"


def size(folder: Path) -> int:
    """The bytes of the files in `folder` (symbolic links not followed)."""
    return sum(os.lstat(os.path.join(d, f)).st_size
               for d, _, files in os.walk(folder) for f in files
               if not os.path.islink(os.path.join(d, f)))


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system than the cache
        shutil.copy2(source, target)


def context_with(folder: Path | None, debs: Path, into: Path) -> Path:
    """A build context at `into`: `folder`'s files (none when None) and `debs/` holding
    the .debs (hard links where they can be)."""
    if folder is not None:
        shutil.copytree(folder, into, symlinks=True, copy_function=_link)
    else:
        into.mkdir(parents=True)
    if (into / "debs").exists():
        raise ImageError(f"{folder} has a debs/ of its own; the fetched packages go there")
    shutil.copytree(debs, into / "debs", copy_function=_link)
    return into
