"""envd's `process.Process` service (Connect RPC, JSON codec) as Rift execs:

- `Start` (server stream): `execs.start`, as the envd user the call names
  (`user` by default, `root` when asked: rift.e2b.shapes.as_user); its output
  as `data` events (a keepalive each quiet `STREAM_WAIT_S`) until the `end`
  event. `stdin: false` gives the command an empty, closed stdin; `stdin: true`
  keeps it open for `SendInput`.
- `Connect` (server stream): a running exec's output from now on, to its end.
- `List`: the sandbox's running execs; `SendSignal`: `execs.kill` (SIGTERM is
  TERM, anything else KILL); `SendInput`, `CloseStdin`: `execs.send_input`.
- PTYs are execs with a terminal (rift.e2b.terminals): `Start` with `pty`,
  `Update` resizes.

A pid names an exec (rift.e2b.shapes.pid); one that names no running exec of
the sandbox is `not_found`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rift.api.waiting import HeldStream
from rift.contract import tools as c
from rift.contract.base import MAX_EXEC_S, command
from rift.contract.views import ExecView
from rift.domain.errors import RiftError
from rift.e2b import shapes, terminals
from rift.e2b.connect import (
    HTTP_OF,
    STREAM_JSON,
    ConnectFault,
    end_stream,
    envelope,
    stream_request,
    timeout_s,
    unary_request,
)
from rift.e2b.envd import Call, EnvdPart, call_of, fault_of, user_of
from rift.services.lifecycle import execs

STREAM_WAIT_S = 15  # the longest quiet before a keepalive event
FIRST_WAIT_S = 1  # how long a start waits for the end (a PTY's: not at all)
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def stream_refusal(fault: ConnectFault) -> Response:
    """A server stream's refusal: 200 with one end-of-stream envelope (Connect's way)."""
    return Response(end_stream(fault), media_type=STREAM_JSON)


def unary_refusal(fault: ConnectFault) -> Response:
    return JSONResponse(fault.body(), status_code=HTTP_OF.get(fault.code, 500))


def _pid(message: dict[str, Any]) -> int:
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 <= pid < 2**32:
        raise ConnectFault("invalid_argument", "process: {pid} of a running process "
                           "(tags are not served)")
    return pid


class Processes(EnvdPart):

    # -- streams ----------------------------------------------------------------------

    async def start(self, request: Request) -> Response:
        return await self._stream(request, self._started)

    async def connect(self, request: Request) -> Response:
        return await self._stream(request, self._found)

    async def _stream(self, request: Request,
                      first: Callable[[Call, dict[str, Any], Request], ExecView]) -> Response:
        """A server stream over one exec: the call and its first view are ordinary calls
        (a refusal is the stream's only envelope); then the events, holding one of
        the caller's waiting places until the stream ends."""
        body = await request.body()
        try:
            message = stream_request(request.headers.get("content-type", ""), body)
            call = await self.state.waiting.run(None, call_of, self.deps, request)
            give = self.state.waiting.take(call.caller.user)
        except ConnectFault as fault:
            return stream_refusal(fault)
        except RiftError as err:
            return stream_refusal(fault_of(err))
        try:
            view = await self.state.waiting.run(None, first, call, message, request)
        except ConnectFault as fault:
            give()
            return stream_refusal(fault)
        except RiftError as err:
            give()
            return stream_refusal(fault_of(err))
        except BaseException:
            give()
            raise
        events = self._events(call, view)
        return HeldStream(self.state.waiting.iterate(events), give, media_type=STREAM_JSON,
                          headers=STREAM_HEADERS)

    def _started(self, call: Call, message: dict[str, Any], request: Request) -> ExecView:
        line = shapes.as_user(self._command(message, call), user_of(request))
        limit = timeout_s(request.headers.get("connect-timeout-ms"), MAX_EXEC_S, MAX_EXEC_S)
        size = terminals.size_of(message)
        stdin = None if message.get("stdin") is True or size else ""
        return execs.start(self.deps, call.caller, command(
            c.VmExecIn, handle=call.handle, vm_id=call.vm_id,
            command=terminals.marked(line) if size else line, stdin=stdin,
            timeout_s=limit, wait_s=0 if size else FIRST_WAIT_S, pty=size))

    def _found(self, call: Call, message: dict[str, Any], _request: Request) -> ExecView:
        found = self._running(call, _pid(message))
        return execs.get(self.deps, call.caller, _reading(call, found.exec_id, found, 0))

    def _command(self, message: dict[str, Any], call: Call) -> str:
        process = message.get("process")
        if not isinstance(process, dict):
            raise ConnectFault("invalid_argument", "process: the process to start")
        cmd, args = process.get("cmd"), process.get("args") or []
        envs, cwd = process.get("envs") or {}, process.get("cwd")
        if not isinstance(cmd, str) or not isinstance(args, list) or \
                not all(isinstance(a, str) for a in args) or not isinstance(envs, dict) or \
                not all(isinstance(v, str) for v in envs.values()) or \
                not isinstance(cwd, str | None):
            raise ConnectFault("invalid_argument", "process: cmd (a string), args (strings), "
                               "envs (strings), cwd (a string)")
        extras = self.registry.get(call.sandbox)
        merged = {**(extras.envs if extras else {}), **envs}
        return shapes.command_line(cmd, args, merged, cwd)

    def _events(self, call: Call, view: ExecView) -> Iterator[bytes]:
        """envd's events for one exec: start, its output as it comes, its end; then the
        end of the stream. In a worker thread."""
        yield envelope({"event": {"start": {"pid": shapes.pid(view.exec_id)}}})
        terminal = terminals.is_terminal(view.command)
        while True:
            said = False
            for name in ("stdout", "stderr"):
                text: str = getattr(view, name)
                if text:
                    yield envelope(shapes.data_event(terminals.stream_name(terminal, name),
                                                     text))
                    said = True
            if view.status != "running":
                yield envelope({"event": {"end": shapes.end_status(
                    view.status, view.exit_code, view.signal)}})
                yield end_stream()
                return
            if not said:
                yield envelope({"event": {"keepalive": {}}})
            try:
                view = execs.get(self.deps, call.caller, _reading(
                    call, view.exec_id, (view.stdout_offset, view.stderr_offset),
                    STREAM_WAIT_S))
            except RiftError as err:
                yield end_stream(fault_of(err))
                return

    # -- unary calls ------------------------------------------------------------------

    async def list(self, request: Request) -> Response:
        return await self.unary(request, self._list)

    async def signal(self, request: Request) -> Response:
        return await self.unary(request, self._signal)

    async def send_input(self, request: Request) -> Response:
        return await self.unary(request, self._input)

    async def close_stdin(self, request: Request) -> Response:
        return await self.unary(request, self._close)

    async def update(self, request: Request) -> Response:
        return await self.unary(request, self._update)

    async def unary(self, request: Request,
                     work: Callable[[Call, dict[str, Any]], dict[str, Any]]) -> Response:
        body = await request.body()
        try:
            message = unary_request(request.headers.get("content-type", ""), body)
            call = await self.state.waiting.run(None, call_of, self.deps, request)
            answer = await self.state.waiting.run(None, work, call, message)
        except ConnectFault as fault:
            return unary_refusal(fault)
        except RiftError as err:
            return unary_refusal(fault_of(err))
        return JSONResponse(answer)

    def _running(self, call: Call, pid: int) -> ExecView:
        running = execs.list_execs(self.deps, call.caller, _listing(call))
        for view in running.execs:
            if shapes.pid(view.exec_id) == pid:
                return view
        raise ConnectFault("not_found", f"process with pid {pid} not found")

    def _list(self, call: Call, _message: dict[str, Any]) -> dict[str, Any]:
        running = execs.list_execs(self.deps, call.caller, _listing(call))
        return {"processes": [
            {"pid": shapes.pid(v.exec_id), "tag": v.exec_id,
             "config": {"cmd": "/bin/sh", "args": ["-c", v.command], "envs": {}}}
            for v in running.execs]}

    def _signal(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        found = self._running(call, _pid(message))
        chosen = "TERM" if message.get("signal") in ("SIGNAL_SIGTERM", 15) else "KILL"
        execs.kill(self.deps, call.caller, command(c.VmExecKillIn, handle=call.handle,
                                                   exec_id=found.exec_id, signal=chosen))
        return {}

    def _input(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        found = self._running(call, _pid(message))
        data = terminals.input_of(message)
        try:
            base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise ConnectFault("invalid_argument", "input.stdin: not base64") from exc
        execs.send_input(self.deps, call.caller, command(
            c.VmExecInputIn, handle=call.handle, exec_id=found.exec_id, data=data,
            encoding="base64"))
        return {}

    def _update(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        found = self._running(call, _pid(message))
        size = terminals.size_of(message)
        if size is not None:
            terminals.resize(self.deps, call, found.exec_id, size)
        return {}

    def _close(self, call: Call, message: dict[str, Any]) -> dict[str, Any]:
        found = self._running(call, _pid(message))
        execs.send_input(self.deps, call.caller, command(
            c.VmExecInputIn, handle=call.handle, exec_id=found.exec_id, eof=True))
        return {}

    async def unimplemented(self, request: Request) -> Response:
        """The RPCs not served yet (unary): Connect's `unimplemented`."""
        await request.body()
        return unary_refusal(_not_served(request))

    async def unimplemented_stream(self, request: Request) -> Response:
        await request.body()
        return stream_refusal(_not_served(request))


def _not_served(request: Request) -> ConnectFault:
    return ConnectFault("unimplemented", f"{request.url.path.rpartition('/e2b')[2]} is not "
                        "served by Rift's E2B door yet (README: Connect E2B code)")


def _listing(call: Call) -> c.VmExecListIn:
    """The sandbox's running execs."""
    return command(c.VmExecListIn, handle=call.handle, vm_id=call.vm_id, status="running")


def _reading(call: Call, exec_id: str, offsets: ExecView | tuple[int, int],
             wait_s: int) -> c.VmExecGetIn:
    """A read of an exec's output from the offsets (an exec's totals so far, or a pair)."""
    out, err = ((offsets.stdout_bytes, offsets.stderr_bytes)
                if isinstance(offsets, ExecView) else offsets)
    return command(c.VmExecGetIn, handle=call.handle, exec_id=exec_id, stdout_offset=out,
                   stderr_offset=err, wait_s=wait_s)
