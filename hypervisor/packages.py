"""Debian packages on the build host: which are installed and at which version,
which own a file, the shared libraries a binary needs, and fetching a package
with `apt-get download` into a cache (never installing it)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.commands import COMMAND_TIMEOUT_S, run_command

KERNEL_META_PACKAGE = "linux-image-cloud-amd64"


def package_version(package: str) -> str:
    """The installed version of `package`; ImageError naming it when it is not installed."""
    try:
        out = run_command(["dpkg-query", "-W", "-f=${Status}\t${Version}", package])
    except ImageError:
        out = ""
    status, _, version = out.partition("\t")
    if not status.endswith(" installed"):
        raise ImageError(f"package {package} is not installed; scripts/libvirt.sh installs it "
                         f"(or apt-get install {package})")
    return version


def installed_file(package: str, path: str) -> Path:
    """`path`, which installed `package` ships; ImageError when either is missing."""
    package_version(package)
    if not Path(path).is_file():
        raise ImageError(f"{path} is missing though {package} is installed; reinstall {package}")
    return Path(path)


def kernel_package() -> tuple[str, str]:
    """The versioned cloud kernel package and its version, as the meta package pins them."""
    for attempt in range(2):
        try:
            shown = run_command(["apt-cache", "show", "--no-all-versions", KERNEL_META_PACKAGE])
        except ImageError:
            if attempt:
                raise
            shown = ""
        match = re.search(r"^Depends:.*?(linux-image-\S+-cloud-amd64) \(= ([^)\s]+)\)",
                          shown, re.MULTILINE)
        if match:
            return match.group(1), match.group(2)
        if attempt == 0:
            # apt knows no packages before its first update
            run_command(["apt-get", "update", "-qq"])
    raise ImageError(f"apt knows no {KERNEL_META_PACKAGE}; check the Debian sources")


def download(package: str, version: str, cache: Path) -> Path:
    """The .deb of `package` at `version` in `cache`, downloaded when not there yet."""
    for deb in cache.glob(f"{package}_*.deb"):
        if run_command(["dpkg-deb", "-f", str(deb), "Version"]).strip() == version:
            return deb
    run_command(["apt-get", "download", "-qq", "-o", "APT::Sandbox::User=root",
                 f"{package}={version}"], cwd=cache)
    for deb in cache.glob(f"{package}_*.deb"):
        if run_command(["dpkg-deb", "-f", str(deb), "Version"]).strip() == version:
            return deb
    raise ImageError(f"apt-get download {package}={version} left no .deb in {cache}")


def unpack(deb: Path, into: Path) -> None:
    """Unpack a .deb's files into `into` (`dpkg-deb -x`: no install, no scripts)."""
    run_command(["dpkg-deb", "-x", str(deb), str(into)])


def shared_libs(binaries: Iterable[Path]) -> set[Path]:
    """The shared libraries (and the loader) that `ldd` says the binaries need."""
    found: set[Path] = set()
    for binary in binaries:
        out = run_command(["ldd", str(binary)])
        for line in out.splitlines():
            match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if match:
                found.add(Path(match.group(1)))
    return found


def owners(paths: Iterable[Path]) -> set[str]:
    """The packages that own these files (best effort: merged /usr hides some paths)."""
    candidates: set[str] = set()
    for path in paths:
        real = os.path.realpath(path)
        candidates |= {str(path), real, real.removeprefix("/usr")}
    try:
        done = subprocess.run(["dpkg", "-S", *sorted(candidates)],  # noqa: S603, S607
                              capture_output=True, text=True, check=False,
                              timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split(":", 1)[0].strip() for line in done.stdout.splitlines() if ":" in line}
