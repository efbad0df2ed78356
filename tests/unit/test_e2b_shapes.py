"""The E2B door's pure parts: sandbox ids and pids, refusal statuses, the command
line a process start becomes, and the Connect protocol's envelopes."""

from __future__ import annotations

import json
import struct

import pytest

from rift.domain.errors import InvalidArgument, LeaseStale, Unauthorized, VmNotFound
from rift.domain.ids import new_exec_id, new_vm_id
from rift.e2b import connect, shapes
from rift.e2b.connect import ConnectFault


def test_a_sandbox_id_is_its_vms_id_without_the_prefix() -> None:
    vm_id = new_vm_id()
    sandbox = shapes.sandbox_id(vm_id)
    assert "_" not in sandbox and shapes.vm_id(sandbox) == vm_id
    for wrong in ("", "ABCDEFGH", "abcdefg", "abcdefghi", "../etc", "abcdefg1", "vm_abcdefgh"):
        assert shapes.vm_id(wrong) is None, wrong


def test_pids_are_uint32_and_stable() -> None:
    ids = [new_exec_id() for _ in range(200)]
    pids = [shapes.pid(i) for i in ids]
    assert all(0 <= p < 2**32 for p in pids)
    assert pids == [shapes.pid(i) for i in ids]
    assert len(set(pids)) > 195


def test_refusals_take_e2b_statuses() -> None:
    assert shapes.status_of(InvalidArgument("x", "y")) == 400
    assert shapes.status_of(Unauthorized()) == 401
    assert shapes.status_of(LeaseStale("task_aaaaaaaa", "api:x", None)) == 403
    assert shapes.status_of(VmNotFound("vm_aaaaaaaa")) == 404
    stale = shapes.message_of(LeaseStale("task_aaaaaaaa", "api:laptop", None))
    assert "api:laptop" in stale and "lease_stale" in stale


def test_the_sdks_bash_command_becomes_bash_or_sh_with_envs_and_cwd() -> None:
    line = shapes.command_line("/bin/bash", ["-l", "-c", "echo 'hi'"], {"A": "x y"}, "/tmp")
    assert line.startswith("export A='x y'; cd /tmp || exit 1; ")
    assert "exec /bin/bash -l -c 'echo '\"'\"'hi'\"'\"''" in line
    # without bash, the exec's own sh runs the script (no second shell started)
    assert line.endswith("; fi; eval 'echo '\"'\"'hi'\"'\"''")
    assert shapes.command_line("ls", ["-la", "a b"], {}, None) == "exec ls -la 'a b'"
    for bad in ("A B", "1A", "A=B", "", "A;rm"):
        with pytest.raises(InvalidArgument):
            shapes.command_line("true", [], {bad: "v"}, None)
    with pytest.raises(InvalidArgument):
        shapes.command_line("", [], {}, None)


def test_an_exec_end_is_envds_end_event() -> None:
    assert shapes.end_status("exited", 3, None) == \
        {"exitCode": 3, "exited": True, "status": "exit status 3"}
    assert shapes.end_status("killed", None, "KILL")["status"] == "signal: kill"
    assert shapes.end_status("lost", None, None)["error"]
    assert shapes.data_event("stdout", "hé") == {"event": {"data": {"stdout": "aMOp"}}}


def _framed(message: bytes, flags: int = 0, size: int | None = None) -> bytes:
    return struct.pack(">BI", flags, len(message) if size is None else size) + message


def test_a_stream_request_is_one_json_envelope() -> None:
    body = _framed(b'{"process": {"cmd": "ls"}}')
    assert connect.stream_request("application/connect+json", body) == \
        {"process": {"cmd": "ls"}}
    refusals = [
        ("application/connect+proto", body, "unimplemented"),
        ("application/connect+json", b"\x00\x00", "invalid_argument"),
        ("application/connect+json", _framed(b"{}", flags=1), "unimplemented"),
        ("application/connect+json", _framed(b"{}", size=9), "invalid_argument"),
        ("application/connect+json", _framed(b"{}") + _framed(b"{}"), "invalid_argument"),
        ("application/connect+json", _framed(b"{no"), "invalid_argument"),
        ("application/connect+json", _framed(b"[1]"), "invalid_argument"),
        ("application/connect+json", _framed(b"\xff\xfe"), "invalid_argument"),
        ("application/connect+json", _framed(b"{}" + b" " * connect.MAX_MESSAGE),
         "invalid_argument"),
    ]
    for ctype, raw, code in refusals:
        with pytest.raises(ConnectFault) as fault:
            connect.stream_request(ctype, raw)
        assert fault.value.code == code, raw[:20]


def test_answers_are_envelopes_ending_with_an_end_of_stream() -> None:
    data = connect.envelope({"event": {"keepalive": {}}}) + \
        connect.end_stream(ConnectFault("not_found", "gone"))
    flags, size = struct.unpack(">BI", data[:5])
    assert flags == 0 and json.loads(data[5:5 + size]) == {"event": {"keepalive": {}}}
    rest = data[5 + size:]
    assert rest[0] == connect.END_STREAM
    assert json.loads(rest[5:]) == {"error": {"code": "not_found", "message": "gone"}}
    assert json.loads(connect.end_stream()[5:]) == {}


def test_a_connect_timeout_is_whole_seconds_within_bounds() -> None:
    assert connect.timeout_s("60000", 5, 100) == 60
    assert connect.timeout_s("1", 5, 100) == 1
    assert connect.timeout_s("999999999", 5, 100) == 100
    for wrong in (None, "", "-1", "1e3", "9" * 30):
        assert connect.timeout_s(wrong, 5, 100) == 5


def test_a_guests_stat_line_is_an_entry_and_a_bad_one_is_left_out() -> None:
    from rift.e2b.entries import entry

    line = "41ed\t4096\troot\twheel\t1700000000\t-\t\t-\t/tmp/a\tb"  # a tab in a name
    assert entry(line) == {
        "name": "a\tb", "type": "FILE_TYPE_DIRECTORY", "path": "/tmp/a\tb", "size": "4096",
        "mode": 0o755, "permissions": "drwxr-xr-x", "owner": "root", "group": "wheel",
        "modifiedTime": "2023-11-14T22:13:20Z"}
    assert entry("81a4\t5\tu\tg\t0\t-\t\t-\t/f")["type"] == "FILE_TYPE_FILE"  # type: ignore[index]
    link = entry("a1ff\t5\tu\tg\t0\t41ed\t/d\t-\t/l")  # a symlink: its target's type
    assert link is not None and (link["type"], link["symlinkTarget"], link["mode"]) == \
        ("FILE_TYPE_DIRECTORY", "/d", 0o755)
    for bad in ("", "41ed\t4096", "zz\t1\tu\tg\t0\t-\t\t-\t/x",
                "41ed\tbig\tu\tg\t0\t-\t\t-\t/x",
                "41ed\t1\tu\tg\t" + "9" * 40 + "\t-\t\t-\t/x"):
        assert entry(bad) is None, bad


def test_a_process_runs_as_the_envd_user_the_call_names() -> None:
    line = "exec ls"
    assert shapes.as_user(line, "root") == line  # Rift's exec is root's already
    default = shapes.as_user(line, "user")
    assert "exec setpriv --reuid=user --regid=user --init-groups env HOME=\"$h\" USER=user " \
        "LOGNAME=user /bin/sh -c 'cd \"$HOME\" || exit 1; exec ls'" in default
    assert "elif command -v su >/dev/null 2>&1; then exec su -s /bin/sh user -c 'cd \"$HOME\"" \
        in default  # busybox's setpriv has no --reuid: its su
    assert default.endswith("fi; fi; unset h n d; exec ls")  # a guest without `user`: root's
    other = shapes.as_user(line, "alice")
    assert "--reuid=alice" in other and other.endswith("not found in the sandbox' >&2; exit 1")
    for bad in ("Alice", "a b", "a;b", "", "-x", "a" * 40):
        with pytest.raises(InvalidArgument):
            shapes.as_user(line, bad)
