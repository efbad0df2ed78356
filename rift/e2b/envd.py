"""envd's data plane, served by Rift for every sandbox: routed by the
`E2b-Sandbox-Id` header, and let in by `X-Access-Token`, the sandbox task's
handle, checked by the engine on every call (a handle that no longer holds the
task is refused 403 naming who holds it now).

- `POST /process.Process/Start` (Connect, server stream): a Rift exec
  (`execs.start`), its output streamed as envd's `data` events until its `end`.
- `GET /files?path=` reads a file, `POST /files` writes one or several
  (multipart, or one `application/octet-stream` body with `?path=`).
- `GET /health`: 204 while the sandbox runs.

The blocking engine calls run in the caller's waiting places (rift.api.waiting).
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rift.api.state import AppState
from rift.api.waiting import HeldStream
from rift.contract.base import MAX_EXEC_S
from rift.contract.views import ExecView
from rift.domain.errors import InvalidArgument, RiftError, Unauthorized, VmNotFound
from rift.e2b import shapes
from rift.e2b.connect import (
    CODES,
    HTTP_OF,
    STREAM_JSON,
    ConnectFault,
    end_stream,
    envelope,
    stream_request,
    timeout_s,
)
from rift.e2b.sandboxes import Registry
from rift.services import execs, guests, vms
from rift.services.context import Caller, Deps
from rift.services.leases import parse_handle

STREAM_WAIT_S = 15  # the longest quiet before a keepalive event
FIRST_WAIT_S = 1  # how long the start waits for the first output or the end
HOMES = {"root": "/root"}


@dataclass(frozen=True)
class Call:
    """A data-plane call: the sandbox's owner (as this door's caller), the handle it
    carried and the VM the sandbox id names."""

    caller: Caller
    handle: str
    vm_id: str
    sandbox: str


def _call(deps: Deps, request: Request) -> Call:
    """Who calls, from the sandbox header and the access token; blocking (one read).
    A missing or malformed token is 401; a sandbox id that names no VM 404. Whether
    the token still holds the task, the engine checks in the call itself."""
    token = request.headers.get("x-access-token")
    sandbox = request.headers.get("e2b-sandbox-id", "")
    if not token:
        raise Unauthorized()
    handle = parse_handle(token)
    vm_id = shapes.vm_id(sandbox)
    if vm_id is None:
        raise VmNotFound(sandbox[:40] or "(no E2b-Sandbox-Id header)")
    with deps.store.read() as tx:
        task = tx.tasks.get(handle.task_id)
    if task is None:
        raise Unauthorized()
    label = task.holder if task.holder and task.holder.startswith("e2b:") else "e2b:envd"
    return Call(Caller(task.owner, label), token, vm_id, sandbox)


def _fault(err: RiftError) -> ConnectFault:
    status = shapes.status_of(err)
    if isinstance(err, VmNotFound):
        return ConnectFault("unavailable", f"sandbox not found: {shapes.message_of(err)}")
    return ConnectFault(CODES.get(status, "unknown"), shapes.message_of(err))


def _refusal(err: RiftError) -> JSONResponse:
    """An envd HTTP route's refusal (`/files`, `/health`): E2B's shape and status; a
    sandbox that is not there is 502 as E2B's proxy answers ("sandbox not found")."""
    if isinstance(err, VmNotFound):
        return JSONResponse(shapes.error_body(502, "The sandbox was not found: "
                                              + shapes.message_of(err)), status_code=502)
    if _missing_file(err):
        return JSONResponse(shapes.error_body(404, shapes.message_of(err)), status_code=404)
    status = shapes.status_of(err)
    return JSONResponse(shapes.error_body(status, shapes.message_of(err)), status_code=status)


def _missing_file(err: RiftError) -> bool:
    # The guest's file operations report a missing path as invalid_argument on
    # `path` with the guest's own words (rift/guest/shell.py).
    return isinstance(err, InvalidArgument) and err.details.get("field") == "path" and (
        "no such file" in err.message.lower())


def _user(request: Request) -> str:
    """The envd user a call names (`Authorization: Basic <user>:`, or `username=`)."""
    named = request.query_params.get("username")
    if named:
        return named
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value, validate=True).decode().partition(":")[0] or "user"
        except (binascii.Error, UnicodeDecodeError):
            return "user"
    return "user"


def _absolute(path: str, user: str) -> str:
    if path.startswith("/"):
        return path
    return posixpath.join(HOMES.get(user, f"/home/{user}"), path)


class Envd:
    def __init__(self, state: AppState, registry: Registry) -> None:
        self.state = state
        self.registry = registry

    @property
    def deps(self) -> Deps:
        return self.state.deps

    # -- processes --------------------------------------------------------------------

    async def start(self, request: Request) -> Response:
        """`process.Process/Start`: always 200 with a Connect stream; a refusal is its
        end-of-stream error (the Connect protocol's way for streams)."""
        body = await request.body()
        try:
            message = stream_request(request.headers.get("content-type", ""), body)
            call = await self.state.waiting.run(None, _call, self.deps, request)
            command = self._command(message, call)
        except ConnectFault as fault:
            return _stream_refusal(fault)
        except RiftError as err:
            return _stream_refusal(_fault(err))
        limit = timeout_s(request.headers.get("connect-timeout-ms"), MAX_EXEC_S, MAX_EXEC_S)
        try:
            give = self.state.waiting.take(call.caller.user)
        except RiftError as err:
            return _stream_refusal(_fault(err))
        try:
            first: ExecView = await self.state.waiting.run(
                None, execs.start, self.deps, call.caller, call.handle, call.vm_id, command,
                None, limit, FIRST_WAIT_S)
        except RiftError as err:
            give()
            return _stream_refusal(_fault(err))
        except BaseException:
            give()
            raise
        events = self._events(call, first)
        return HeldStream(self.state.waiting.iterate(events), give, media_type=STREAM_JSON,
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _command(self, message: dict[str, Any], call: Call) -> str:
        process = message.get("process")
        if not isinstance(process, dict):
            raise ConnectFault("invalid_argument", "process: the process to start")
        if message.get("pty"):
            raise ConnectFault("unimplemented", "PTYs are not served by this door yet")
        if message.get("stdin") is True:
            raise ConnectFault("unimplemented", "stdin to a command is not served by this "
                               "door yet: start it with stdin off")
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
        """envd's events for one exec: start, its output as it comes (a keepalive each
        quiet `STREAM_WAIT_S`), its end; then the end of the stream. In a worker thread."""
        yield envelope({"event": {"start": {"pid": shapes.pid(view.exec_id)}}})
        while True:
            said = False
            for name in ("stdout", "stderr"):
                text: str = getattr(view, name)
                if text:
                    yield envelope(shapes.data_event(name, text))
                    said = True
            if view.status != "running":
                yield envelope({"event": {"end": shapes.end_status(
                    view.status, view.exit_code, view.signal)}})
                yield end_stream()
                return
            if not said:
                yield envelope({"event": {"keepalive": {}}})
            try:
                view = execs.get(self.deps, call.caller, call.handle, view.exec_id,
                                 view.stdout_offset, view.stderr_offset, STREAM_WAIT_S)
            except RiftError as err:
                yield end_stream(_fault(err))
                return

    async def unimplemented(self, request: Request) -> Response:
        """The other envd RPCs (unary): Connect's `unimplemented`, as E2B answers a call
        it does not serve."""
        await request.body()
        fault = ConnectFault("unimplemented", f"{request.url.path.rpartition('/e2b')[2]} is "
                             "not served by Rift's E2B door yet (README: Connect E2B code)")
        return JSONResponse(fault.body(), status_code=HTTP_OF[fault.code])

    async def unimplemented_stream(self, request: Request) -> Response:
        await request.body()
        return _stream_refusal(ConnectFault(
            "unimplemented", f"{request.url.path.rpartition('/e2b')[2]} is not served by "
            "Rift's E2B door yet (README: Connect E2B code)"))

    # -- files and health -------------------------------------------------------------

    async def read(self, request: Request) -> Response:
        path = request.query_params.get("path", "")
        try:
            call = await self.state.waiting.run(None, _call, self.deps, request)
            if not path:
                raise InvalidArgument("path", "the file to read")
            read = await self.state.waiting.run(
                None, guests.read_file, self.deps, call.caller, call.handle, call.vm_id,
                _absolute(path, _user(request)), "base64")
        except RiftError as err:
            return _refusal(err)
        if read.truncated:
            return JSONResponse(shapes.error_body(
                400, f"{path} is larger than the {read.bytes} bytes a read carries here"),
                status_code=400)
        return Response(base64.b64decode(read.content), media_type="application/octet-stream")

    async def write(self, request: Request) -> Response:
        user = _user(request)
        try:
            call = await self.state.waiting.run(None, _call, self.deps, request)
            files = await self._uploads(request, user)
            written = []
            for path, data in files:
                await self.state.waiting.run(None, self._write, call, path, data)
                written.append({"name": posixpath.basename(path), "type": "file",
                                "path": path})
        except RiftError as err:
            return _refusal(err)
        return JSONResponse(written)

    async def _uploads(self, request: Request, user: str) -> list[tuple[str, bytes]]:
        if request.headers.get("content-encoding"):
            raise InvalidArgument("Content-Encoding", "compressed uploads are not taken yet")
        kind = request.headers.get("content-type", "").split(";", maxsplit=1)[0].strip().lower()
        if kind == "application/octet-stream":
            path = request.query_params.get("path")
            if not path:
                raise InvalidArgument("path", "an octet-stream upload names its file in ?path=")
            return [(_absolute(path, user), await request.body())]
        if kind != "multipart/form-data":
            raise InvalidArgument("Content-Type", "multipart/form-data or "
                                  "application/octet-stream")
        out: list[tuple[str, bytes]] = []
        async with request.form(max_files=100, max_fields=100) as form:
            for _name, value in form.multi_items():
                if not isinstance(value, UploadFile):
                    continue
                path = value.filename or request.query_params.get("path")
                if not path:
                    raise InvalidArgument("path", "each file part names its path")
                out.append((_absolute(path, user), await value.read()))
        return out

    def _write(self, call: Call, path: str, data: bytes) -> None:
        """Write one file; its folder is made first when it is not there (E2B makes the
        directories a path needs)."""
        content = base64.b64encode(data).decode("ascii")
        try:
            guests.write_file(self.deps, call.caller, call.handle, call.vm_id, path, content,
                              "base64")
        except InvalidArgument as err:
            if err.details.get("field") != "path":
                raise
            folder = posixpath.dirname(path)
            made = execs.start(self.deps, call.caller, call.handle, call.vm_id,
                               f"mkdir -p -- {shlex.quote(folder)}",
                               None, 30, 30)
            if made.exit_code != 0:
                raise InvalidArgument("path", f"{folder}: could not be made: "
                                      f"{made.stderr.strip()[:200]}") from err
            guests.write_file(self.deps, call.caller, call.handle, call.vm_id, path, content,
                              "base64")

    async def health(self, request: Request) -> Response:
        try:
            call = await self.state.waiting.run(None, _call, self.deps, request)
            vm = await self.state.waiting.run(None, vms.get_vm, self.deps, call.caller,
                                              call.vm_id)
        except RiftError as err:
            return _refusal(err)
        if vm.status != "running" or vm.task_id != parse_handle(call.handle).task_id:
            return JSONResponse(shapes.error_body(502, "The sandbox was not found"),
                                status_code=502)
        return Response(status_code=204)


def _stream_refusal(fault: ConnectFault) -> Response:
    return Response(end_stream(fault), media_type=STREAM_JSON)
