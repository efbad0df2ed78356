"""`rift-shell`, root's login shell in the `debian` image (hypervisor/rift_shell.c),
compiled here with the helper and bash it runs pointed at stand-ins: every line
Rift sends to start, read, feed or kill an exec runs the helper with exactly the
words bash would give it and no bash; any other line, and a login, is bash's, with
bash's answer. SHELL is bash's either way."""

from __future__ import annotations

import random
import string
import subprocess
from pathlib import Path

import pytest

from hypervisor.exec_helper import CFLAGS, GUEST_PATH, SHELL_SOURCE, login_shell
from rift.guest.exec_view import input_command, kill_command, read_command, start_command
from rift.services.ports import ExecRead, ExecStart

BASH_MARK = "<bash started>"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(rift-shell, its helper, its bash): the helper prints its arguments and
    SHELL; the bash says it started, then is /bin/bash."""
    folder = tmp_path_factory.mktemp("rift-shell")
    helper = folder / "helper"
    helper.write_text("#!/bin/sh\nprintf '<%s>' \"$0\" \"$@\"; printf ' SHELL=%s\\n' \"$SHELL\"\n")
    bash = folder / "bash"
    bash.write_text(f"#!/bin/sh\necho '{BASH_MARK}'\nexec /bin/bash \"$@\"\n")
    for script in (helper, bash):
        script.chmod(0o755)
    return _compiled(folder / "rift-shell", HELPER=helper, BASH=bash), helper, bash


def _compiled(target: Path, **paths: Path) -> Path:
    defines = [f'-D{name}="{path}"' for name, path in paths.items()]
    subprocess.run(["gcc", *CFLAGS, *defines, "-o", str(target), str(SHELL_SOURCE)], check=True)
    return target


def _run(argv: list[str], stdin: bytes = b"", executable: Path | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=30, check=False,
                          executable=executable,
                          env={"PATH": "/usr/bin:/bin", "SHELL": "/usr/lib/rift/rift-shell"})
    return done.stdout.decode(errors="replace")


def _both(built: tuple[Path, Path, Path], line: str) -> tuple[str, str]:
    """What rift-shell answers to `line`, and what bash does as root's shell."""
    shell, _, bash = built
    bashs = _run(["/bin/bash", "-c", line])
    return _run([str(shell), "-c", line]), bashs.replace("SHELL=/usr/lib/rift/rift-shell",
                                                         f"SHELL={bash}")


def test_the_images_shell_runs_the_helper_the_images_carry(tmp_path: Path) -> None:
    assert f"exec {GUEST_PATH} ".encode() in login_shell(tmp_path).read_bytes()


def test_rifts_exec_lines_run_the_helper_with_bashs_words_and_no_bash(
        built: tuple[Path, Path, Path]) -> None:
    _, helper, bash = built
    rng = random.Random(7)
    alphabet = string.printable + "é'\"\\$`!*?~{}[],;&|"
    commands = ["", "true", "echo 'it''s' \"$HOME\" | wc -c; exit 3", "a\nb", "'", "\"'\"",
                *("".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
                  for _ in range(200))]
    lines = [start_command(ExecStart(exec_id=f"exec_{n}", command=command, timeout_s=60,
                                     cap_bytes=1024, wait_ms=500, max_bytes=64,
                                     stdin=b"" if n % 2 else None),
                           helper=str(helper), clock_cs=n if n % 3 else None)
             for n, command in enumerate(commands)]
    lines += [read_command(ExecRead(exec_id="exec_1", stdout_offset=5, stderr_offset=0,
                                    max_bytes=64, wait_ms=0), helper=str(helper)),
              input_command("exec_1", eof=True, helper=str(helper)),
              kill_command("exec_1", "TERM", helper=str(helper))]
    for line in lines:
        ours, bashs = _both(built, line)
        assert ours == bashs, line
        assert ours.startswith(f"<{helper}>") and ours.endswith(f" SHELL={bash}\n"), line
        assert BASH_MARK not in ours, line


@pytest.mark.parametrize("tail", [
    "a  b", "a ", "", "$HOME", "a;b", "~", "a\nb", "*", "{a,b}", "'open", "a\"b\"", "a\\ b",
    "`id`", "a # b", "a|cat", "a\tb",
])
def test_any_other_line_is_bashs(built: tuple[Path, Path, Path], tail: str) -> None:
    _, helper, _ = built
    for line in (f"exec {helper} {tail}", f"echo hi; exec {helper} {tail}",
                 f"exec {helper.parent}/other {tail}"):
        ours, bashs = _both(built, line)
        assert ours == f"{BASH_MARK}\n{bashs}", line


def test_a_login_is_a_bash_login_shell(tmp_path: Path) -> None:
    shell = _compiled(tmp_path / "rift-shell", HELPER=tmp_path / "helper")  # and /bin/bash
    said = _run(["-rift-shell"], b"shopt -q login_shell && echo login; echo \"SHELL=$SHELL\"\n",
                executable=shell)
    assert said.endswith("login\nSHELL=/bin/bash\n")
