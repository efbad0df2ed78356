"""envd's PTYs as Rift execs with a terminal (SPEC §16; rift.services.lifecycle.
exec_terminal): `Start` with `pty: {size: {rows, cols}}` starts the exec with
`pty` (rift.e2b.processes), its output streamed as `pty` data events; `SendInput`
with `input.pty` is its stdin; `Update` with `pty.size` resizes its terminal;
`SendSignal` kills it; `Connect` by pid reconnects to it.

The sizes are checked once, by the contract (rift.contract.execs.TerminalSize):
0 x 0 or 10,000 columns is `invalid_argument`. A PTY's command begins with MARK
(a shell no-op), so the exec's record says it is one: a reconnect after `rift
serve` restarted, or through another replica, still streams `pty` data (the
terminal itself lives in the guest, as any exec does).
"""

from __future__ import annotations

from typing import Any

from rift.contract import execs as c
from rift.contract.base import command
from rift.e2b.connect import ConnectFault
from rift.e2b.envd import Call
from rift.services.context import Deps
from rift.services.lifecycle import exec_terminal

MARK = ": e2b pty; "  # what a PTY's command begins with (the door's lines never do)


def marked(line: str) -> str:
    return MARK + line


def is_terminal(command_text: str) -> bool:
    return command_text.startswith(MARK)


def size_of(message: dict[str, Any]) -> dict[str, int] | None:
    """The terminal size a Start or Update message asks for (`pty.size`), None
    without `pty`. Only the shape is checked here; the bounds are the contract's.
    A side left out is 0 (proto3's JSON leaves zeros out)."""
    pty = message.get("pty")
    if pty is None:
        return None
    size = pty.get("size") if isinstance(pty, dict) else None
    if not isinstance(size, dict):
        raise ConnectFault("invalid_argument", "pty: {size: {rows, cols}}")
    sides = {name: size.get(name, 0) for name in ("rows", "cols")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sides.values()):
        raise ConnectFault("invalid_argument", "pty.size: rows and cols are whole numbers")
    return sides


def resize(deps: Deps, call: Call, exec_id: str, size: dict[str, int]) -> None:
    exec_terminal.resize(deps, call.caller, command(
        c.VmExecResizeIn, handle=call.handle, exec_id=exec_id, **size))


def stream_name(terminal: bool, name: str) -> str:
    """The data event's field for an exec's stream: a terminal has one, `pty`."""
    return "pty" if terminal else name


def input_of(message: dict[str, Any]) -> str:
    """SendInput's bytes (base64): `input.stdin`, or `input.pty` for a terminal."""
    given = message.get("input")
    if not isinstance(given, dict):
        raise ConnectFault("invalid_argument", "input: {stdin or pty: <base64 bytes>}")
    data = given.get("pty", given.get("stdin", ""))
    if not isinstance(data, str):
        raise ConnectFault("invalid_argument", "input: {stdin or pty: <base64 bytes>}")
    return data
