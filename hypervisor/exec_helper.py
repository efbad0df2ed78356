"""`rift-exec`, the guest half of Rift's execs (SPEC §10; the source and its
commands are in rift_exec.c): a static x86-64 binary, compiled here from that
one C file with the host's gcc and glibc's static libc, so it runs in any
Linux guest. Rift's images carry it at GUEST_PATH; a build is cached beside the
images by the digest of its source and the compiler's version.

`rift-shell` (rift_shell.c), root's login shell in the `debian` image, is built
the same way: it runs a session's `exec GUEST_PATH ...` line itself and hands
any other to bash, so that an exec starts one bash, not two."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.commands import run_command
from hypervisor.manifest import sha256

SOURCE = Path(__file__).with_name("rift_exec.c")
GUEST_PATH = "/usr/lib/rift/rift-exec"
SHELL_SOURCE = Path(__file__).with_name("rift_shell.c")
SHELL_PATH = "/usr/lib/rift/rift-shell"
CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror")


SHELL_DEFINES = (f'-DHELPER="{GUEST_PATH}"',)  # the helper rift-shell runs


def build_inputs(source: Path = SOURCE, defines: tuple[str, ...] = ()) -> str:
    """What a binary is made from (its source, gcc's version and flags), as a digest."""
    return sha256(source.read_bytes() + _gcc_version().encode()
                  + " ".join(CFLAGS + defines).encode())


def exec_helper(cache_dir: Path) -> Path:
    """The compiled helper, built into `cache_dir` unless a build of the same
    inputs is there. ImageError names what is missing (gcc, libc6-dev)."""
    return compiled(SOURCE, cache_dir / f"rift-exec-{build_inputs()[:16]}")


def login_shell(cache_dir: Path) -> Path:
    """The compiled rift-shell, built as `exec_helper` builds the helper."""
    digest = build_inputs(SHELL_SOURCE, SHELL_DEFINES)[:16]
    return compiled(SHELL_SOURCE, cache_dir / f"rift-shell-{digest}", SHELL_DEFINES)


def compiled(source: Path, target: Path, defines: tuple[str, ...] = ()) -> Path:
    """`source` compiled with CFLAGS (and `defines`) to `target` unless `target` is
    there already (named by the digest of what it is built from): built aside, then
    moved in."""
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    name = target.name.rsplit("-", 1)[0]
    fd, aside = tempfile.mkstemp(prefix=f".{name}-", dir=target.parent)
    os.close(fd)
    try:
        run_command(["gcc", *CFLAGS, *defines, "-o", aside, str(source)])
        os.chmod(aside, 0o755)  # noqa: S103 (a program every guest user runs)
        os.replace(aside, target)
    except ImageError as exc:
        raise ImageError(f"cannot compile {name}: {exc} (apt-get install gcc libc6-dev)") \
            from exc
    finally:
        Path(aside).unlink(missing_ok=True)
    return target


def _gcc_version() -> str:
    if shutil.which("gcc") is None:
        raise ImageError("gcc is not installed; it compiles rift-exec (apt-get install gcc "
                         "libc6-dev)")
    return run_command(["gcc", "-dumpfullversion"]).strip()
