"""The exec helper's view as a hostile guest may print it (SPEC §15): each bad
answer is a ViewError within milliseconds, never a pattern that backtracks."""

from __future__ import annotations

import time

import pytest

from rift.guest.exec_view import VIEW_LINE_MAX, ViewError, parse_view, view_size

GOOD = (b"rift-exec state=ended code=0 signal=-1 timed_out=0 killed=0 stdin=closed "
        b"started=1733360000000 ended=1733360000100 out_total=3 err_total=2 out_from=0 "
        b"out_len=3 err_from=0 err_len=2\n")


def view(line: bytes = GOOD, body: bytes = b"outer") -> bytes:
    return line + body


def test_a_whole_view_is_read_with_its_output() -> None:
    seen = parse_view(view(), 4096)
    assert (seen.state, seen.exit_code, seen.signal, seen.stdin_open) == ("ended", 0, None, False)
    assert (seen.stdout, seen.stderr, seen.ended_ms) == (b"out", b"er", 1733360000100)


def test_a_running_view_with_no_output_and_open_stdin() -> None:
    line = GOOD.replace(b"state=ended", b"state=running").replace(b"code=0", b"code=-1") \
        .replace(b"stdin=closed", b"stdin=open").replace(b"ended=1733360000100", b"ended=0") \
        .replace(b"out_len=3", b"out_len=0").replace(b"err_len=2", b"err_len=0")
    seen = parse_view(line, 0)
    assert (seen.state, seen.exit_code, seen.stdin_open, seen.ended_ms) == \
        ("running", None, True, None)


HOSTILE = {
    "sixty a= and no newline": b"rift-exec " + b"a=" * 60,
    "sixty a= then a newline": b"rift-exec " + b"a=" * 60 + b"\n",
    "ten MiB with no newline": b"rift-exec " + b"a=b " * (10 * 1024 * 1024 // 4),
    "a newline past the view's size": b"rift-exec " + b"x" * VIEW_LINE_MAX + b"\n",
    "fewer bytes than announced": view(body=b"oute"),
    "more bytes than announced": view(body=b"outers"),
    "lengths past what was asked": view(GOOD.replace(b"out_len=3", b"out_len=5000"),
                                        b"x" * 5002),
    "a negative length": view(GOOD.replace(b"out_len=3", b"out_len=-3"), b"er"),
    "a negative total": view(GOOD.replace(b"out_total=3", b"out_total=-1")),
    "a huge number": view(GOOD.replace(b"started=1733360000000", b"started=" + b"9" * 4000)),
    "a number past its range": view(GOOD.replace(b"timed_out=0", b"timed_out=7")),
    "a number that is not one": view(GOOD.replace(b"code=0", b"code=0x1")),
    "unicode digits": view(GOOD.replace(b"code=0", "code=\u0663".encode())),
    "a duplicate key": view(GOOD.replace(b"code=0", b"code=0 code=1")),
    "an unknown key": view(GOOD.replace(b"code=0", b"code=0 extra=1")),
    "an unknown state": view(GOOD.replace(b"state=ended", b"state=dancing")),
    "a missing field": view(GOOD.replace(b" killed=0", b"")),
    "a field without a value": view(GOOD.replace(b"killed=0", b"killed")),
    "not a view at all": b"sh: rift-exec: not found\n",
    "nothing": b"",
}


@pytest.mark.parametrize("data", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_answer_is_refused_within_milliseconds(data: bytes) -> None:
    began = time.perf_counter()
    with pytest.raises(ViewError):
        parse_view(data, 4096)
    assert time.perf_counter() - began < 0.5  # the backtracking view took minutes


def test_the_view_size_bounds_what_a_call_reads() -> None:
    assert view_size(0) == len(b"rift-exec ") + VIEW_LINE_MAX
    assert view_size(100) == view_size(0) + 200
    assert len(view()) <= view_size(3)
