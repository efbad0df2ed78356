"""Large request bodies parsed in a process of their own (SPEC §15: large bodies
are parsed off the event loop): `/mcp`'s (rift.api.mcp.door) and REST's
(rift.api.gate.OffLoopRequest).

A thread is not enough: CPython's JSON parsers (the standard library's and
pydantic-core's) hold the GIL for the whole parse, so a body parsed in a worker
thread stops the event loop's thread all the same (measured: 38 MiB of small
numbers, 0.5-0.9 s with either parser, in a thread or not). So a body over
64 KiB goes to a child process (`python -I -c`, nothing of Rift imported),
which parses it with the parser the SDK's transport would use, counts its
values, and sends the value back in `marshal`'s format, which this process reads
at the speed of copying (a tools/call's bulk is one long string). A body of more
than MAX_VALUES values is refused there: a large body carries its bulk in
strings (file content, exec stdin and input), and millions of small values
would cost this process as much to read back as to parse.

One child serves the process, one body at a time, started on first use and
again after it dies; it exits when this process goes (its stdin closes).
"""

from __future__ import annotations

import json
import logging
import marshal
import struct
import subprocess
import sys
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any

import pydantic_core

log = logging.getLogger("rift.api")

MAX_VALUES = 100_000  # JSON values (strings, numbers, objects, ...) in one large body
PARSE_TIMEOUT_S = 30.0
_LENGTH = struct.Struct(">Q")

# The child: read (parser, length, body), answer (length, marshal of
# ("ok", value) or ("error", exception class, message, position) or ("values", count)).
_CHILD = r"""
import json, marshal, struct, sys
import pydantic_core
LENGTH = struct.Struct(">Q")
LIMIT = int(sys.argv[1])
src, dst = sys.stdin.buffer, sys.stdout.buffer

def read(n):
    data = src.read(n)
    if len(data) != n:
        sys.exit(0)
    return data

def count(value):
    seen, stack = 0, [value]
    while stack:
        item = stack.pop()
        seen += 1
        if seen > LIMIT:
            return seen
        if isinstance(item, dict):
            stack.extend(item.values())
            seen += len(item)
        elif isinstance(item, list):
            stack.extend(item)
    return seen

while True:
    parser = read(1)
    (size,) = LENGTH.unpack(read(LENGTH.size))
    body = read(size)
    try:
        value = json.loads(body) if parser == b"j" else pydantic_core.from_json(body)
    except json.JSONDecodeError as exc:
        out = marshal.dumps(("error", "JSONDecodeError", exc.msg[:500], exc.pos))
    except (ValueError, RecursionError) as exc:
        out = marshal.dumps(("error", type(exc).__name__, str(exc)[:500], -1))
    else:
        seen = count(value)
        out = marshal.dumps(("ok", value) if seen <= LIMIT else ("values", seen))
    del body
    dst.write(LENGTH.pack(len(out)) + out)
    dst.flush()
"""


class TooManyValues(ValueError):
    """A large body of more JSON values than MAX_VALUES."""

    def __init__(self, seen: int) -> None:
        super().__init__(f"more than {MAX_VALUES} JSON values ({seen} seen)")
        self.seen = seen


@dataclass
class Parsed:
    """What parsing a body gave: its value, or the error that parser raised."""

    value: Any = None
    error: Exception | None = None


class BodyParser:
    """The child process and the lock that gives it one body at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None

    def parse(self, body: bytes, stdlib: bool) -> Parsed:
        """`body` parsed as `json.loads` (`stdlib`) or `pydantic_core.from_json`
        would, in the child; blocking (call it from a worker thread). TooManyValues
        as the error when it holds more than MAX_VALUES values. OSError when the
        child cannot be run or did not answer within PARSE_TIMEOUT_S (it is then
        stopped; the next body starts another)."""
        with self._lock:
            child = self._running()
            assert child.stdin is not None and child.stdout is not None
            timer = threading.Timer(PARSE_TIMEOUT_S, child.kill)
            timer.start()
            try:
                child.stdin.write(b"j" if stdlib else b"p")
                child.stdin.write(_LENGTH.pack(len(body)))
                child.stdin.write(body)
                child.stdin.flush()
                (size,) = _LENGTH.unpack(_read(child.stdout, _LENGTH.size))
                answer = marshal.loads(_read(child.stdout, size))  # noqa: S302 - our child's
            except (OSError, ValueError, EOFError, struct.error) as exc:
                self._stop()
                raise OSError(f"the parser process failed: {exc}") from exc
            finally:
                timer.cancel()
        if answer[0] == "ok":
            return Parsed(value=answer[1])
        if answer[0] == "values":
            return Parsed(error=TooManyValues(int(answer[1])))
        if answer[1] == "JSONDecodeError":  # as json.loads raises it: message and position
            return Parsed(error=json.JSONDecodeError(answer[2], "", answer[3]))
        error = RecursionError if answer[1] == "RecursionError" else ValueError
        return Parsed(error=error(answer[2]))

    def _running(self) -> subprocess.Popen[bytes]:
        child = self._child
        if child is None or child.poll() is not None:
            self._stop()
            child = self._child = subprocess.Popen(  # noqa: S603 - this Python, our code
                [sys.executable, "-I", "-c", _CHILD, str(MAX_VALUES)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait(5)
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    with suppress(OSError):
                        pipe.close()

    def close(self) -> None:
        with self._lock:
            self._stop()


def _read(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError("the parser process ended")
    return data


PARSER = BodyParser()  # the process's one


def parse_body(body: bytes, stdlib: bool) -> Parsed:
    """`body` parsed by PARSER; where that process cannot run, here (blocking: call it
    from a worker thread, where the GIL is then held as it would be on the loop)."""
    try:
        return PARSER.parse(body, stdlib)
    except OSError as exc:
        log.warning("large bodies are parsed in this process", extra={"error": str(exc)})
    try:
        return Parsed(value=json.loads(body) if stdlib else pydantic_core.from_json(body))
    except (ValueError, RecursionError) as error:
        return Parsed(error=error)
