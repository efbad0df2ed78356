"""`rift-pty`, the guest half of an exec with a terminal (SPEC §16's PTYs; the
source and its commands are in rift_pty.c): a static x86-64 binary compiled
here from that one C file, as rift-exec is (hypervisor.exec_helper). Images do
not carry it: Rift puts it into a guest at GUEST_PATH on the guest's first
terminal (rift.guest.execs), so no image is rebuilt for it. GUEST_PATH names the
source's digest: a guest holding an older build gets the new one beside it."""

from __future__ import annotations

from pathlib import Path

from hypervisor.exec_helper import CFLAGS, compiled
from hypervisor.manifest import sha256

SOURCE = Path(__file__).with_name("rift_pty.c")
DIGEST = sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode())[:16]
GUEST_PATH = f"/usr/lib/rift/rift-pty-{DIGEST}"


def pty_helper(cache_dir: Path) -> Path:
    """The compiled helper, built into `cache_dir` unless a build of this source is
    there. ImageError names what is missing (gcc, libc6-dev)."""
    return compiled(SOURCE, cache_dir / f"rift-pty-{DIGEST}")


def run_command_line(rows: int, cols: int, tty_file: str, command: str) -> str:
    """The shell line that runs `command` (quoted already) on a new terminal of
    `rows` x `cols`, its name written to `tty_file`."""
    return f"exec {GUEST_PATH} run {rows} {cols} {tty_file} -- {command}"


def resize_command_line(tty_file: str, rows: int, cols: int) -> str:
    return f"exec {GUEST_PATH} resize {tty_file} {rows} {cols}"
