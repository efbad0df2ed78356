"""The root file system of the `debian` image: Debian 12 made with debootstrap
(`--variant=minbase` plus the packages agents need) from the Debian mirror apt
already uses (`debian_root`), and a copy of it set up for Rift's own init
(`set_up`): no SSH host keys (each VM makes its own), sshd for keys only,
Rift's second-stage init and a static busybox (whose `init` reaps orphans as
PID 1) under /usr/lib/rift, root's login shell rift-shell (hypervisor/
rift_shell.c: an exec's line needs no bash, any other line gets it), no apt
caches, and E2B's user `user` (home /home/user, passwordless sudo; `python` is
python3 by `python-is-python3`).

The debootstrapped root is kept as debootstrap left it in
`<cache>/roots/<key>/`, the key a digest of what made it (suite, mirror,
packages), so a rebuild of the image and every test run on the machine reuse
it; the copy is made of hard links (`cp -al`), so `set_up` replaces files and
never writes into one. The .debs are kept in `<cache>/debootstrap-debs/`.
Nothing comes from anywhere but the package registry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.commands import run_command
from hypervisor.exec_helper import GUEST_PATH, SHELL_PATH
from hypervisor.manifest import digest, sha256

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "python3", "python3-pip", "python3-venv", "git", "curl", "ca-certificates",
    "build-essential", "procps", "iproute2", "sudo", "openssh-server", "less",
    "e2fsprogs", "netbase", "xz-utils", "python-is-python3",
)
ROOT_VERSION = 1
ROOT_INIT = Path(__file__).with_name("debian_root_init.sh")
DEBOOTSTRAP_TIMEOUT_S = 1800
SSHD_CONFIG = """\
# Written by Rift: root logs in with the task's key only; one ed25519 host key,
# made by each VM at its boot (/usr/lib/rift/init).
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
X11Forwarding no
PrintMotd no
PrintLastLog no
"""
INITTAB = "::ctrlaltdel:/usr/lib/rift/busybox poweroff -f\n::shutdown:/bin/sync\n"
# E2B's `base` has the user `user` (home /home/user, passwordless sudo), whom the
# E2B door runs commands as (SPEC §16); Rift's own door stays root (SSH's user).
USER = "user"
USER_ID = 1000
USER_HOME = "/home/user"
USER_ENTRIES = {
    "passwd": f"{USER}:x:{USER_ID}:{USER_ID}::{USER_HOME}:/bin/bash",
    # `*`: no password to log in with; a change day (not 0) so PAM never asks for one
    "shadow": f"{USER}:*:20000:0:99999:7:::",
    "group": f"{USER}:x:{USER_ID}:",
    "gshadow": f"{USER}:!::",
}
SUDOERS = f"# Written by Rift: E2B's user `{USER}` runs sudo without a password.\n" \
          f"{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"


def mirror() -> str:
    """The Debian mirror apt uses here (deb822 `URIs:` or a `deb` line), else deb.debian.org."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        for match in re.finditer(r"(?:^URIs:|^deb)\s+(?:\[[^]]*\]\s+)?(https?://\S+/debian)/?\s",
                                 text + "\n", re.MULTILINE):
            return match.group(1)
    return DEFAULT_MIRROR


def root_key(mirror_url: str) -> str:
    """What a debootstrapped root is made from, as the name of its cache folder."""
    made_of: dict[str, object] = {"version": ROOT_VERSION, "suite": SUITE,
                                  "mirror": mirror_url, "packages": PACKAGES}
    return digest(json.dumps(made_of, sort_keys=True).encode()).removeprefix("sha256:")[:16]


def set_up_digest(busybox: Path, helper: Path, shell: Path) -> str:
    """What `set_up` puts into a root, as a digest (a build input)."""
    return digest(json.dumps({"init": sha256(ROOT_INIT.read_bytes()), "sshd": SSHD_CONFIG,
                              "inittab": INITTAB, "user": USER_ENTRIES,
                              "sudoers": SUDOERS, "busybox": sha256(busybox.read_bytes()),
                              "rift_exec": sha256(helper.read_bytes()),
                              "rift_shell": sha256(shell.read_bytes())},
                             sort_keys=True).encode())


def debian_root(cache: Path) -> tuple[Path, str]:
    """(the debootstrapped root, its key): from the cache, or made there, with the
    packages `extra` beside PACKAGES. The folder is shared: copy it (`linked_copy`)
    before changing anything."""
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed (apt-get install debootstrap)")
    mirror_url = mirror()
    key = root_key(mirror_url)
    roots = cache / "roots"
    done = roots / key
    if (done / "etc" / "debian_version").is_file():
        return done, key
    debs = cache / "debootstrap-debs"
    debs.mkdir(parents=True, exist_ok=True)
    roots.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=roots))
    try:
        root = work / "root"
        run_command(["debootstrap", "--variant=minbase",
                     f"--include={','.join(PACKAGES)}",
                     f"--cache-dir={debs}", SUITE, str(root), mirror_url],
                    timeout_s=DEBOOTSTRAP_TIMEOUT_S)
        if done.exists():  # a racing build finished first
            return done, key
        root.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done, key


def linked_copy(root: Path, into: Path) -> None:
    """A copy of `root` at `into` made of hard links (fast, no data copied), or a
    plain copy where `into` is on another file system than the cache."""
    try:
        run_command(["cp", "-al", str(root), str(into)], timeout_s=DEBOOTSTRAP_TIMEOUT_S)
    except ImageError:
        shutil.rmtree(into, ignore_errors=True)
        run_command(["cp", "-a", str(root), str(into)], timeout_s=DEBOOTSTRAP_TIMEOUT_S)


def set_up(root: Path, busybox: Path, helper: Path, shell: Path) -> None:
    """Make a (linked) copy of a debootstrapped root Rift's: its init, exec
    helper (`helper`, hypervisor.exec_helper) and root's login shell (`shell`,
    rift-shell, the same module's), sshd's keys-only set-up, no host keys, no
    apt caches, no machine id. Files are replaced, never written into (they are
    hard links to the cached root's)."""
    rift = root / "usr" / "lib" / "rift"
    rift.mkdir(parents=True, exist_ok=True)
    _put(rift / "busybox", busybox.read_bytes(), 0o755)
    _put(rift / "init", ROOT_INIT.read_bytes(), 0o755)
    _put(root / GUEST_PATH.lstrip("/"), helper.read_bytes(), 0o755)
    _put(root / SHELL_PATH.lstrip("/"), shell.read_bytes(), 0o755)
    _replace(root / "etc" / "passwd", "".join(
        _with_shell(line) for line in (root / "etc" / "passwd").read_text().splitlines(True)))
    shells = (root / "etc" / "shells").read_text()
    if SHELL_PATH not in shells.split():
        _replace(root / "etc" / "shells", shells + SHELL_PATH + "\n")
    _put(root / "etc" / "ssh" / "sshd_config.d" / "60-rift.conf", SSHD_CONFIG.encode())
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    _put(root / "etc" / "inittab", INITTAB.encode())
    _put(root / "etc" / "hostname", b"rift\n")
    _put(root / "etc" / "hosts", b"127.0.0.1 localhost\n10.0.2.15 rift\n"
         b"::1 localhost ip6-localhost ip6-loopback\n")
    _put(root / "etc" / "machine-id", b"")
    for cached in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        cached.unlink()
    for folder in ("var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        path = root / folder
        if path.is_dir():
            for entry in path.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
    (root / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    add_user(root)


def add_user(root: Path) -> None:
    """E2B's user: `user` (uid and gid 1000, in the group `sudo`), a home made
    from /etc/skel and a sudoers rule without a password (files replaced, owners
    and modes kept)."""
    etc = root / "etc"
    for name, entry in USER_ENTRIES.items():
        lines = [line for line in (etc / name).read_text().splitlines()
                 if not line.startswith(f"{USER}:")]
        lines = [_with_member(line) if line.startswith("sudo:") else line for line in lines]
        _replace(etc / name, "\n".join([*lines, entry]) + "\n")
    _put(etc / "sudoers.d" / USER, SUDOERS.encode(), 0o440)
    home = root / USER_HOME.lstrip("/")
    if home.exists():
        shutil.rmtree(home)
    shutil.copytree(etc / "skel", home, symlinks=True, copy_function=shutil.copy2)
    home.chmod(0o755)  # useradd's, as E2B makes `user`
    for path in [home, *home.rglob("*")]:
        os.lchown(path, USER_ID, USER_ID)


def _with_shell(line: str) -> str:
    """A passwd line with SHELL_PATH as its shell when it is root's."""
    if not line.startswith("root:"):
        return line
    fields = line.rstrip("\n").split(":")
    return ":".join([*fields[:6], SHELL_PATH]) + "\n"


def _with_member(line: str) -> str:
    """A group line (`sudo:x:27:` or gshadow's `sudo:*::`) with USER among its members."""
    members = [m for m in line.rsplit(":", 1)[1].split(",") if m]
    return line.rsplit(":", 1)[0] + ":" + ",".join([*members, USER] if USER not in members
                                                   else members)


def _replace(path: Path, text: str) -> None:
    """Replace a file with `text`, keeping its mode and owner (it may be a hard link)."""
    facts = path.stat()
    _put(path, text.encode(), facts.st_mode & 0o7777)
    os.chown(path, facts.st_uid, facts.st_gid)


def _put(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace the file at `path` (unlinked first: it may be a hard link)."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
