"""E2B's user on a real `debian` guest (SPEC §16, issue #28), driven by E2B's own
SDK: the door runs commands, PTYs and files as `user` (home /home/user,
passwordless sudo, `python`), as E2B's `base` does, and as `root` when the SDK
asks; Rift's own door (REST and MCP execs) stays root. One server and one
sandbox for the module."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize

from tests.support.e2b import e2b_opts
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import Server, real_vms_missing

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

REAL = RealSettings(env={"RIFT_DEFAULT_IMAGE": "debian", "RIFT_VM_BOOT_TIMEOUT_S": "240"},
                    debian=True)


@dataclass
class World:
    srv: Server
    sbx: Sandbox


@pytest.fixture(scope="module")
def world(rig: Rig) -> Iterator[World]:
    sbx = Sandbox.create(**e2b_opts(rig.server.url, rig.server.token))  # type: ignore[arg-type]
    try:
        yield World(rig.server, sbx)
    finally:
        sbx.kill()


def test_commands_run_as_user_in_its_home_by_default(world: World) -> None:
    ran = world.sbx.commands.run('whoami; echo "$HOME $USER $LOGNAME"; pwd; id -u; id -Gn')
    lines = ran.stdout.splitlines()
    assert lines[:4] == ["user", "/home/user user user", "/home/user", "1000"]
    assert "sudo" in lines[4].split()
    relative = world.sbx.commands.run("mkdir -p work && cd work && pwd")
    assert relative.stdout == "/home/user/work\n"
    assert world.sbx.commands.run("pwd", cwd="work").stdout == "/home/user/work\n"


def test_user_has_passwordless_sudo_and_python(world: World) -> None:
    assert world.sbx.commands.run("sudo -n whoami").stdout == "root\n"
    assert world.sbx.commands.run("sudo -n cat /etc/shadow | grep -c '^root:'").stdout == "1\n"
    with pytest.raises(CommandExitException):  # and is no root without it
        world.sbx.commands.run("cat /etc/shadow")
    python = world.sbx.commands.run("python -c 'import sys; print(sys.version_info[0])'")
    assert python.stdout == "3\n"


def test_root_when_the_sdk_asks(world: World) -> None:
    ran = world.sbx.commands.run('whoami; echo "$HOME"; id -u', user="root")
    assert ran.stdout == "root\n/root\n0\n"
    background = world.sbx.commands.run("sleep 0.5; whoami", user="root", background=True)
    assert background.wait().stdout == "root\n"


def test_files_belong_to_user_and_relative_paths_are_under_its_home(world: World) -> None:
    files = world.sbx.files
    assert files.write("notes.txt", "mine").path == "/home/user/notes.txt"
    info = files.get_info("/home/user/notes.txt")
    assert (info.owner, info.group) == ("user", "user")
    assert files.get_info("/home/user").owner == "user"
    assert world.sbx.commands.run("cat notes.txt; echo more >> notes.txt").stdout == "mine"
    assert files.read("notes.txt") == "minemore\n"
    as_root = files.write("/root/secret.txt", "r", user="root")
    assert files.get_info(as_root.path, user="root").owner == "root"


def test_a_pty_is_a_shell_of_user(world: World) -> None:
    terminal = world.sbx.pty.create(PtySize(rows=24, cols=80))
    world.sbx.pty.send_stdin(terminal.pid, b"echo who=$(whoami) home=$HOME at=$(pwd); exit 3\n")
    heard: list[bytes] = []
    with pytest.raises(CommandExitException) as ended:
        terminal.wait(on_pty=heard.append)
    assert ended.value.exit_code == 3
    assert "who=user home=/home/user at=/home/user" in b"".join(heard).decode()


def test_rift_s_own_door_stays_root(world: World) -> None:
    handle = world.sbx._envd_access_token  # the task's handle (the door's lease)
    assert handle
    answer = httpx.post(f"{world.srv.url}/api/v1/vms/vm_{world.sbx.sandbox_id}/exec",
                        json={"command": "whoami; pwd"}, timeout=60,
                        headers={"Authorization": f"Bearer {world.srv.token}",
                                 "Rift-Handle": handle})
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "root\n/root\n"


def test_a_user_the_guest_lacks_is_refused(world: World) -> None:
    with pytest.raises(CommandExitException) as failed:
        world.sbx.commands.run("whoami", user="nobody-here")
    assert "user nobody-here not found" in failed.value.stderr


def test_e2bs_code_interpreter_runs_code_in_contexts_with_its_charts(world: World) -> None:
    """E2B's code interpreter SDK (`e2b-code-interpreter`) on the same sandbox (SPEC §20):
    `run_code` keeps state, answers its results, logs, errors and count, a run's envs, a
    PNG as its chart, and contexts are made, listed, restarted and removed (rift-code's
    own kernel: debian has no ipykernel); the kernel is root's, as Rift's execs are, and
    `on_stdout` hears a line before the cell ends."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    opts = e2b_opts(world.srv.url, world.srv.token)
    sbx = CodeSandbox.connect(world.sbx.sandbox_id, **opts)  # type: ignore[arg-type]
    assert sbx.run_code("x = 41").error is None
    ran = sbx.run_code("print('hi')\nx + 1")
    assert (ran.text, ran.logs.stdout, ran.execution_count) == ("42", ["hi\n"], 2)
    assert sbx.run_code("import os; os.environ.get('PLACE')", envs={"PLACE": "here"}).text \
        == "'here'"
    failed = sbx.run_code("1 / 0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    pixel = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGMAAQAABQABDQottA"
             "AAAABJRU5ErkJggg==")
    chart = sbx.run_code("class Chart:\n    def _repr_png_(self):\n        import base64\n"
                         f"        return base64.b64decode({pixel!r})\nChart()")
    assert chart.results[0].png == pixel
    context = sbx.create_code_context(cwd="/tmp")
    assert sbx.run_code("import os; os.getcwd()", context=context).text == "'/tmp'"
    assert sbx.run_code("'x' in globals()", context=context).text == "False"
    assert context.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(context)
    sbx.remove_code_context(context)
    assert context.id not in [c.id for c in sbx.list_code_contexts()]
    # the kernel runs as rift_vm_exec does (root), and its output streams as it comes
    heard: list[float] = []
    sbx.run_code("import getpass, time\nprint(getpass.getuser(), flush=True)\n"
                 "time.sleep(1)\nprint('done')",
                 on_stdout=lambda out: heard.append(time.monotonic()))
    ended = time.monotonic()
    assert len(heard) == 2 and ended - heard[0] >= 0.8, (heard, ended)
    assert sbx.run_code("import getpass; getpass.getuser()").text == "'root'"
