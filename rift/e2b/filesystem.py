"""envd's `filesystem.Filesystem` unary RPCs (Stat, ListDir, MakeDir, Move, Remove)
as Rift execs: each is one short POSIX shell script run by `execs.start` (the
same engine call as `rift_vm_exec`; busybox and coreutils alike), answering its
entries as lines of `stat -c` that are parsed here. Its output is the guest's,
so hostile (SPEC §15): bounded by the exec's answer, split on tabs with a fixed
count, a line that does not parse is left out.

A path that is not there is `not_found`; a directory that exists already for
MakeDir `already_exists`; ListDir of something not a directory
`invalid_argument`. Watches are not served yet.
"""

from __future__ import annotations

import shlex
import stat as modes
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rift.contract import tools as c
from rift.contract.base import command
from rift.e2b.connect import ConnectFault
from rift.e2b.envd import Call, absolute, user_of
from rift.e2b.processes import Processes
from rift.services.lifecycle import execs

SCRIPT_S = 30  # a file operation's exec: its timeout and how long the call waits for it
MAX_DEPTH = 32
MISSING, EXISTS, NOT_DIR = 20, 21, 22
FORMAT = "%f\t%s\t%U\t%G\t%Y\t%n"  # raw mode (hex), size, owner, group, mtime, name
_STAT = f"stat -c '{FORMAT}' --"
_MISSING = f'[ -e "$p" ] || [ -L "$p" ] || exit {MISSING}; '
_FAULTS = {MISSING: ("not_found", "no such file or directory"),
           EXISTS: ("already_exists", "it exists already"),
           NOT_DIR: ("invalid_argument", "not a directory")}


def _text(message: dict[str, Any], key: str) -> str:
    value = message.get(key)
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ConnectFault("invalid_argument", f"{key}: a path")
    return value


def entry(line: str) -> dict[str, Any] | None:
    """envd's EntryInfo from one line of `FORMAT`, or None when it does not parse."""
    parts = line.split("\t", 5)
    if len(parts) != 6:
        return None
    raw_mode, size, owner, group, mtime, path = parts
    try:
        mode, length, moment = int(raw_mode, 16), int(size), int(mtime)
        when = datetime.fromtimestamp(moment, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    kind = "FILE_TYPE_DIRECTORY" if modes.S_ISDIR(mode) else \
        "FILE_TYPE_SYMLINK" if modes.S_ISLNK(mode) else "FILE_TYPE_FILE"
    return {"name": path.rstrip("/").rpartition("/")[2] or path, "type": kind, "path": path,
            "size": str(length), "mode": modes.S_IMODE(mode),
            "permissions": modes.filemode(mode), "owner": owner[:64], "group": group[:64],
            "modifiedTime": when.isoformat().replace("+00:00", "Z")}


class Filesystem:
    def __init__(self, processes: Processes) -> None:
        self.processes = processes

    def _run(self, call: Call, script: str) -> list[dict[str, Any]]:
        deps = self.processes.deps
        view = execs.start(deps, call.caller, command(
            c.VmExecIn, handle=call.handle, vm_id=call.vm_id, command=script, stdin="",
            timeout_s=SCRIPT_S, wait_s=SCRIPT_S))
        if view.status == "running":
            execs.kill(deps, call.caller, command(c.VmExecKillIn, handle=call.handle,
                                                  exec_id=view.exec_id, signal="KILL"))
            raise ConnectFault("deadline_exceeded", f"the file operation took over {SCRIPT_S} s")
        if view.exit_code in _FAULTS:
            code, why = _FAULTS[view.exit_code]
            raise ConnectFault(code, why)
        if view.exit_code != 0:
            raise ConnectFault("unknown", view.stderr.strip()[:500] or f"failed ({view.status})")
        return [found for line in view.stdout.splitlines() if (found := entry(line))]

    def _one(self, call: Call, script: str) -> dict[str, Any]:
        found = self._run(call, script)
        if not found:
            raise ConnectFault("internal", "the guest answered no entry")
        return {"entry": found[0]}

    def _path(self, request: Request, message: dict[str, Any], key: str = "path") -> str:
        return shlex.quote(absolute(_text(message, key), user_of(request)))

    async def stat(self, request: Request) -> Response:
        return await self.processes.unary(request, lambda call, m: self._one(
            call, f"p={self._path(request, m)}; {_MISSING}{_STAT} \"$p\""))

    async def make_dir(self, request: Request) -> Response:
        return await self.processes.unary(request, lambda call, m: self._one(
            call, f"p={self._path(request, m)}; [ -e \"$p\" ] && exit {EXISTS}; "
            f"mkdir -p -- \"$p\" && {_STAT} \"$p\""))

    async def move(self, request: Request) -> Response:
        return await self.processes.unary(request, lambda call, m: self._one(
            call, f"p={self._path(request, m, 'source')}; "
            f"d={self._path(request, m, 'destination')}; {_MISSING}"
            f"mv -- \"$p\" \"$d\" && {_STAT} \"$d\""))

    async def remove(self, request: Request) -> Response:
        def work(call: Call, m: dict[str, Any]) -> dict[str, Any]:
            self._run(call, f"p={self._path(request, m)}; {_MISSING}rm -rf -- \"$p\"")
            return {}
        return await self.processes.unary(request, work)

    async def list_dir(self, request: Request) -> Response:
        def work(call: Call, m: dict[str, Any]) -> dict[str, Any]:
            depth = m.get("depth") or 1
            if not isinstance(depth, int) or not 0 < depth <= MAX_DEPTH:
                raise ConnectFault("invalid_argument", f"depth: 1–{MAX_DEPTH}")
            found = self._run(call, (
                f"p={self._path(request, m)}; {_MISSING}[ -d \"$p\" ] || exit {NOT_DIR}; "
                f"find \"$p\" -mindepth 1 -maxdepth {depth} -exec {_STAT} {{}} +"))
            return {"entries": found}
        return await self.processes.unary(request, work)
