"""The command line an E2B process start becomes runs in a real shell as the SDK
meant it: its environment, its folder, its quoting and its exit code."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from rift.e2b import shapes


def _run(line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True,
                          timeout=30, check=False)


def test_the_command_line_keeps_envs_cwd_quoting_and_exit_code() -> None:
    script = "echo \"$A|$B|$(pwd)\"; printf '%s\\n' \"it's\" '$HOME'; exit 7"
    line = shapes.command_line("/bin/bash", ["-l", "-c", script],
                               {"A": "x y", "B": "'quoted' $HOME"}, "/tmp")
    ran = _run(line)
    assert ran.returncode == 7, ran.stderr
    assert ran.stdout == "x y|'quoted' $HOME|/tmp\nit's\n$HOME\n"


def test_a_missing_folder_ends_the_command_before_it_runs() -> None:
    ran = _run(shapes.command_line("/bin/bash", ["-c", "echo ran"], {}, "/no/such/dir"))
    assert ran.returncode == 1 and ran.stdout == ""


def test_a_program_with_arguments_runs_as_given() -> None:
    ran = _run(shapes.command_line("printf", ["%s-%s", "a b", "$c"], {}, None))
    assert (ran.returncode, ran.stdout) == (0, "a b-$c")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="switching users takes root and setpriv")
def test_a_command_runs_as_the_user_named_in_its_home_with_relative_cwd_under_it() -> None:
    # `daemon` (home /usr/sbin) stands for the guest's `user` (the host has none); `..`
    # is relative to its home
    line = shapes.command_line("/bin/sh", ["-c", 'id -un; echo "$HOME $USER $LOGNAME"; pwd'],
                               {"A": "x"}, "..")
    ran = _run(shapes.as_user(line, "daemon"))
    assert (ran.returncode, ran.stdout) == (0, "daemon\n/usr/sbin daemon daemon\n/usr\n")
    as_root = _run(shapes.as_user(shapes.command_line("id", ["-u"], {}, None), "root"))
    assert as_root.stdout == "0\n"
    missing = _run(shapes.as_user("echo ran", "nobody-here"))
    assert (missing.returncode, missing.stdout) == (1, "")
    assert "user nobody-here not found" in missing.stderr



def test_without_bash_the_execs_own_shell_runs_the_script_and_the_switch_leaves_nothing(
        ) -> None:
    # a guest without /bin/bash (busybox `tiny`) is played by naming a bash that is not
    # there: the exec's own sh runs the script (no second shell), as `sh -c` would,
    # and the user switch's variables are gone before it
    script = 'echo "[$h$n$d]" "$A"; (exit 3)'
    line = shapes.as_user(shapes.command_line("/bin/bash", ["-l", "-c", script],
                                              {"A": "a b"}, "/tmp"), shapes.DEFAULT_USER)
    assert "[ -x /bin/bash ]" in line
    for bash in ("/bin/bash", "/no/such/bash"):
        ran = _run(line.replace("[ -x /bin/bash ]", f"[ -x {bash} ]"))
        assert (ran.returncode, ran.stdout) == (3, "[] a b\n"), (bash, ran.stderr)
    missing = _run(shapes.as_user(shapes.command_line("/bin/sh", ["-c", "echo ran"], {}, None),
                                  "nobody-here-either"))
    assert (missing.returncode, missing.stdout) == (1, "")
