"""The E2B door's PTY parts (rift.e2b.terminals): the size a Start or Update asks
for (its shape checked here, its bounds by the contract), a PTY's input, its data
events named `pty`, the interactive shell `pty.create` starts (bash where the
image has it, else sh), and the mark that tells a PTY's exec from others."""

from __future__ import annotations

import pytest

from rift.contract import execs as c
from rift.contract.base import command
from rift.domain.errors import InvalidArgument
from rift.e2b import shapes, terminals
from rift.e2b.connect import ConnectFault


def test_a_start_without_pty_asks_for_no_terminal_and_one_with_it_for_its_size() -> None:
    assert terminals.size_of({"process": {"cmd": "ls"}}) is None
    assert terminals.size_of({"pty": {"size": {"rows": 24, "cols": 80}}}) == \
        {"rows": 24, "cols": 80}
    assert terminals.size_of({"pty": {"size": {"cols": 80}}}) == {"rows": 0, "cols": 80}


@pytest.mark.parametrize("pty", ["80x24", {"size": None}, {"size": [24, 80]}, {},
                                 {"size": {"rows": "24", "cols": 80}},
                                 {"size": {"rows": True, "cols": 80}},
                                 {"size": {"rows": 2.5, "cols": 80}}])
def test_a_malformed_pty_is_invalid_argument(pty: object) -> None:
    with pytest.raises(ConnectFault) as fault:
        terminals.size_of({"pty": pty})
    assert fault.value.code == "invalid_argument"


@pytest.mark.parametrize("size", [{"rows": 0, "cols": 0}, {"rows": 24, "cols": 10_000},
                                  {"rows": 0, "cols": 80}, {"rows": -1, "cols": 80},
                                  {"rows": 24, "cols": 2**40}])
def test_a_size_out_of_bounds_is_refused_by_the_contract(size: dict[str, int]) -> None:
    shaped = terminals.size_of({"pty": {"size": size}})
    assert shaped is not None
    with pytest.raises(InvalidArgument) as err:
        command(c.VmExecResizeIn, exec_id="exec_abcd2345", **shaped)
    assert err.value.code == "invalid_argument"


def test_pty_input_is_read_as_stdin_is() -> None:
    assert terminals.input_of({"input": {"pty": "ZWNobwo="}}) == "ZWNobwo="
    assert terminals.input_of({"input": {"stdin": "eA=="}}) == "eA=="
    assert terminals.input_of({"input": {}}) == ""
    for bad in ({}, {"input": "x"}, {"input": {"pty": 3}}):
        with pytest.raises(ConnectFault):
            terminals.input_of(bad)


def test_a_terminals_output_is_pty_data() -> None:
    assert terminals.stream_name(True, "stdout") == "pty"
    assert terminals.stream_name(False, "stderr") == "stderr"
    assert shapes.data_event("pty", "hi") == {"event": {"data": {"pty": "aGk="}}}


def test_pty_create_runs_bash_where_the_image_has_it_else_sh() -> None:
    line = shapes.command_line("/bin/bash", ["-i", "-l"], {"ABC": "1 2"}, "/")
    assert line == ("export ABC='1 2'; cd / || exit 1; if [ -x /bin/bash ]; then exec "
                    "/bin/bash -i -l; else exec /bin/sh -i -l; fi")
    assert shapes.command_line("/bin/bash", ["-i", "x"], {}, None) == "exec /bin/bash -i x"


def test_a_ptys_command_says_it_is_one_and_no_other_door_command_does() -> None:
    line = shapes.command_line("/bin/bash", ["-i", "-l"], {}, "/")
    assert terminals.is_terminal(terminals.marked(line))
    for cmd, args, envs, cwd in (("/bin/bash", ["-l", "-c", ": e2b pty; x"], {}, None),
                                 (":", ["e2b", "pty;"], {}, None),
                                 ("ls", [], {"A": "1"}, "/"), ("/bin/bash", ["-i"], {}, None)):
        assert not terminals.is_terminal(shapes.command_line(cmd, args, envs, cwd))
