"""Execs with a terminal (SPEC §16's PTYs): the contract bounds a terminal's size
in one place (0 x 0 and 10,000 columns are invalid_argument), the engine hands
the size to the guest and resizes a running terminal only (over the fake guest),
and rift-pty, compiled as guests get it and run here on the host, runs a shell
on a terminal of the size asked, resizes it from outside, passes the shell's
exit status on and hangs the shell up when it is told to end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hypervisor.pty_helper import SOURCE, pty_helper
from rift.contract import execs as c
from rift.contract import tools as t
from rift.contract.base import command
from rift.domain.errors import InvalidArgument
from rift.services.context import Deps
from rift.services.lifecycle import exec_terminal, execs, tasks, vms
from tests.support.cache import CACHE
from tests.support.engine import ALICE, refused
from tests.support.fake_guest import FakeExecs, fake_guests
from tests.support.vm_rows import give_ssh_address


@pytest.mark.parametrize(("rows", "cols"), [(0, 0), (24, 10_000), (0, 80), (1001, 80)])
def test_a_terminal_size_out_of_bounds_is_invalid_argument(rows: int, cols: int) -> None:
    with pytest.raises(InvalidArgument):
        command(c.VmExecResizeIn, exec_id="exec_abcd2345", rows=rows, cols=cols)
    with pytest.raises(InvalidArgument):
        command(c.VmExecIn, vm_id="vm_abcd2345", command="sh", pty={"rows": rows, "cols": cols})


def test_the_guest_helper_bounds_sizes_as_the_contract_does() -> None:
    declared = re.search(r"#define MAX_SIDE (\d+)", SOURCE.read_text())
    assert declared is not None and int(declared.group(1)) == c.MAX_TERMINAL_SIDE


@pytest.fixture
def shell() -> FakeExecs:
    return FakeExecs()


@pytest.fixture
def gdeps(deps: Deps, shell: FakeExecs) -> Deps:
    return replace(deps, guests=fake_guests(execs=shell))


def _vm(deps: Deps) -> tuple[str, str]:
    opened = tasks.new(deps, ALICE, command(t.TaskNewIn))
    vm = vms.new(deps, ALICE, command(t.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id


def test_the_engine_starts_a_terminal_of_the_size_asked_and_resizes_it_while_it_runs(
        gdeps: Deps, shell: FakeExecs) -> None:
    handle, vm_id = _vm(gdeps)
    term = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                                             command="sh -i", pty={"rows": 24, "cols": 80},
                                             wait_s=0))
    assert shell.execs[term.exec_id].pty == (24, 80)
    exec_terminal.resize(gdeps, ALICE, command(c.VmExecResizeIn, handle=handle,
                                               exec_id=term.exec_id, rows=50, cols=132))
    assert shell.execs[term.exec_id].pty == (50, 132)
    plain = execs.start(gdeps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id,
                                              command="sleep 9", wait_s=0))
    assert shell.execs[plain.exec_id].pty is None
    err = refused("invalid_argument", exec_terminal.resize, gdeps, ALICE, command(
        c.VmExecResizeIn, handle=handle, exec_id=plain.exec_id, rows=10, cols=10))
    assert "no terminal" in err.message
    shell.finish(term.exec_id)
    execs.get(gdeps, ALICE, command(c.VmExecGetIn, handle=handle, exec_id=term.exec_id))
    err = refused("invalid_argument", exec_terminal.resize, gdeps, ALICE, command(
        c.VmExecResizeIn, handle=handle, exec_id=term.exec_id, rows=10, cols=10))
    assert "ended" in err.message


# -- rift-pty on the host -------------------------------------------------------------

@pytest.fixture(scope="module")
def helper() -> str:
    return str(pty_helper(CACHE / "helpers"))


def _run(helper: str, tty: Path, rows: int = 24, cols: int = 80,
         command: str = "exec /bin/sh -i") -> subprocess.Popen[bytes]:
    return subprocess.Popen([helper, "run", str(rows), str(cols), str(tty), "--", command],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env={"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "PS1": "$ "})


def _named(tty: Path) -> None:
    deadline = time.monotonic() + 5
    while not tty.exists():
        assert time.monotonic() < deadline, "rift-pty wrote no terminal name"
        time.sleep(0.01)


def test_rift_pty_runs_a_shell_on_a_terminal_of_the_size_asked_and_passes_its_status_on(
        helper: str, tmp_path: Path) -> None:
    tty = tmp_path / "tty"
    proc = _run(helper, tty, 30, 100)
    out, _ = proc.communicate(b"tty; stty size; exit 3\n", timeout=10)
    assert proc.returncode == 3
    text = out.decode().replace("\r", "")
    assert "30 100\n" in text and tty.read_text() in text  # the shell's terminal is its own
    assert tty.read_text().startswith("/dev/pts/")


def test_rift_pty_resizes_a_running_terminal_and_a_term_hangs_its_shell_up(
        helper: str, tmp_path: Path) -> None:
    tty = tmp_path / "tty"
    proc = _run(helper, tty)
    try:
        _named(tty)
        resized = subprocess.run([helper, "resize", str(tty), "40", "120"], check=False)
        assert resized.returncode == 0
        assert proc.stdin is not None
        proc.stdin.write(b"stty size\n")
        proc.stdin.flush()
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "40 120" in out.decode()
    assert proc.returncode == 128 + signal.SIGHUP  # its shell was hung up
    for args in (["0", "80"], ["24", "10000"], ["x", "80"]):
        assert subprocess.run([helper, "resize", str(tty), *args], check=False,
                              capture_output=True).returncode == 2
    assert subprocess.run([helper, "resize", str(tmp_path / "none"), "24", "80"],
                          check=False).returncode == 3


def test_a_term_the_moment_the_terminal_is_named_still_hangs_its_shell_up(
        helper: str, tmp_path: Path) -> None:
    """A hang-up asked before the child has made its session (or reset its signals)
    is sent again until the shell is gone: before, it reached no process group and
    the helper waited for good (seen under load in make test)."""
    for n in range(5):
        tty = tmp_path / f"tty{n}"
        proc = _run(helper, tty)
        try:
            _named(tty)
            os.kill(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 128 + signal.SIGHUP
