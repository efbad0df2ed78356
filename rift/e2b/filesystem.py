"""envd's `filesystem.Filesystem` unary RPCs (Stat, ListDir, MakeDir, Move, Remove)
as Rift execs: each is one short POSIX shell script run by `execs.start` (the
same engine call as `rift_vm_exec`; busybox and coreutils alike), answering its
entries as rift.e2b.entries prints and parses them (hostile output: bounded,
split on tabs with a fixed count, a line that does not parse left out).

A path that is not there is `not_found` (Remove of one is done: envd removes
with `RemoveAll`); a directory that exists already for MakeDir `already_exists`;
ListDir of something not a directory `invalid_argument`. What MakeDir makes
belongs to the user the call names when the guest has that user (envd's way).
Watches are rift.e2b.watches.
"""

from __future__ import annotations

import shlex
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rift.contract import tools as c
from rift.contract.base import command
from rift.e2b import entries
from rift.e2b.connect import ConnectFault
from rift.e2b.envd import Call, absolute, user_of
from rift.e2b.processes import Processes
from rift.services.lifecycle import execs

SCRIPT_S = 30  # a file operation's exec: its timeout and how long the call waits for it
MAX_DEPTH = 32
MISSING, EXISTS, NOT_DIR = 20, 21, 22
_MISSING = f'[ -e "$p" ] || [ -L "$p" ] || exit {MISSING}; '
_FAULTS = {MISSING: ("not_found", "no such file or directory"),
           EXISTS: ("already_exists", "it exists already"),
           NOT_DIR: ("invalid_argument", "not a directory")}


def own(user: str, var: str = "p") -> str:
    """Shell: give "$<var>" to `user` (and its group) when the guest has that user."""
    who = shlex.quote(user)
    return (f'if id -u {who} >/dev/null 2>&1; then chown -h "$(id -u {who}):$(id -g {who})" '
            f'-- "${var}"; fi; ')


def _text(message: dict[str, Any], key: str) -> str:
    value = message.get(key)
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ConnectFault("invalid_argument", f"{key}: a path")
    return value


def run_script(processes: Processes, call: Call, script: str) -> str:
    """Run one file script in the sandbox; its stdout, or the fault its exit code names."""
    deps = processes.deps
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
    return view.stdout


class Filesystem:
    def __init__(self, processes: Processes) -> None:
        self.processes = processes

    def _run(self, call: Call, script: str) -> list[dict[str, Any]]:
        return entries.parse(run_script(self.processes, call, script))

    def _one(self, call: Call, script: str) -> dict[str, Any]:
        found = self._run(call, script)
        if not found:
            raise ConnectFault("internal", "the guest answered no entry")
        return {"entry": found[0]}

    def _path(self, request: Request, message: dict[str, Any], key: str = "path") -> str:
        return absolute(_text(message, key), user_of(request))

    async def stat(self, request: Request) -> Response:
        def work(call: Call, m: dict[str, Any]) -> dict[str, Any]:
            path = self._path(request, m)
            return self._one(call, f"p={shlex.quote(path)}; {_MISSING}"
                             f"{entries.script([path])}")
        return await self.processes.unary(request, work)

    async def make_dir(self, request: Request) -> Response:
        def work(call: Call, m: dict[str, Any]) -> dict[str, Any]:
            path = self._path(request, m)
            return self._one(call, f"p={shlex.quote(path)}; [ -e \"$p\" ] && exit {EXISTS}; "
                             f"mkdir -p -- \"$p\" || exit 1; {own(user_of(request))}"
                             f"{entries.script([path])}")
        return await self.processes.unary(request, work)

    async def move(self, request: Request) -> Response:
        def work(call: Call, m: dict[str, Any]) -> dict[str, Any]:
            source, target = self._path(request, m, "source"), \
                self._path(request, m, "destination")
            return self._one(call, f"p={shlex.quote(source)}; d={shlex.quote(target)}; "
                             f"{_MISSING}mv -- \"$p\" \"$d\" || exit 1; "
                             f"{entries.script([target])}")
        return await self.processes.unary(request, work)

    async def remove(self, request: Request) -> Response:
        def work(call: Call, m: dict[str, Any]) -> dict[str, Any]:
            run_script(self.processes, call,
                       f"rm -rf -- {shlex.quote(self._path(request, m))}")
            return {}
        return await self.processes.unary(request, work)

    async def list_dir(self, request: Request) -> Response:
        def work(call: Call, m: dict[str, Any]) -> dict[str, Any]:
            depth = m.get("depth") or 1
            if not isinstance(depth, int) or not 0 < depth <= MAX_DEPTH:
                raise ConnectFault("invalid_argument", f"depth: 1–{MAX_DEPTH}")
            path = self._path(request, m)
            found = self._run(call, (
                f"p={shlex.quote(path)}; {_MISSING}[ -d \"$p\" ] || exit {NOT_DIR}; "
                f"{entries.script([path], depth)}"))
            return {"entries": found}
        return await self.processes.unary(request, work)
