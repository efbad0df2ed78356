"""envd's data plane, served by Rift for every sandbox: routed by the
`E2b-Sandbox-Id` header, and let in by `X-Access-Token`, the sandbox task's
handle, checked by the engine on every call (a handle that no longer holds the
task is refused 403 naming who holds it now). Processes are rift.e2b.processes;
here are who calls, the refusals, and envd's HTTP routes:

- `GET /files?path=` reads a file, `POST /files` writes one or several
  (multipart, or one `application/octet-stream` body with `?path=`); gzip both
  ways, `X-Metadata-*` kept as the file's `user.e2b.*` attributes, and a URL
  signed with the sandbox's token (`signature=`) instead of the token itself
  (rift.e2b.uploads). A written file belongs to the user the call names.
- `GET /health`: 204 while the sandbox runs.

The blocking engine calls run in the caller's waiting places (rift.api.waiting).
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import shlex
import time
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rift.api.state import AppState
from rift.contract import tools as c
from rift.contract.base import MAX_CONTENT, command
from rift.domain.errors import (
    HandleRequired,
    InvalidArgument,
    RiftError,
    Unauthorized,
    VmNotFound,
)
from rift.e2b import asleep, sandboxes, shapes, uploads
from rift.e2b.connect import (
    CODES,
    ConnectFault,
)
from rift.e2b.sandboxes import Registry
from rift.services.context import Caller, Deps
from rift.services.lifecycle import execs, files, vms
from rift.services.lifecycle.leases import parse_handle

HOMES = {"root": "/root"}


@dataclass(frozen=True)
class Call:
    """A data-plane call: the sandbox's owner (as this door's caller), the handle it
    carried and the VM the sandbox id names."""

    caller: Caller
    handle: str
    vm_id: str
    sandbox: str


def call_of(deps: Deps, request: Request) -> Call:
    """Who calls, from the sandbox header and the access token; blocking (one read).
    A missing or malformed token is 401; a sandbox id that names no VM 404. Whether
    the token still holds the task, the engine checks in the call itself."""
    return call_for(deps, request.headers.get("x-access-token"),
                    request.headers.get("e2b-sandbox-id", ""))


def call_for(deps: Deps, token: str | None, sandbox: str) -> Call:
    """`call_of` for a token and a sandbox id however they came."""
    if not token:
        raise HandleRequired()  # 401: the sandbox's envdAccessToken is its task's handle
    handle = parse_handle(token)
    vm_id = shapes.vm_id(sandbox)
    if vm_id is None:
        raise VmNotFound(sandbox[:40] or "(no E2b-Sandbox-Id header)")
    with deps.store.read() as tx:
        task = tx.tasks.get(handle.task_id)
        paused = asleep.paused_in(tx, vm_id)
    if task is None:
        raise Unauthorized()
    asleep.admit(deps, paused)  # a sandbox paused at its end: autoResume decides
    label = task.holder if task.holder and task.holder.startswith("e2b:") else "e2b:envd"
    return Call(Caller(task.owner, label), token, vm_id, sandbox)


def fault_of(err: RiftError) -> ConnectFault:
    status = shapes.status_of(err)
    if isinstance(err, VmNotFound):
        return ConnectFault("unavailable", f"sandbox not found: {shapes.message_of(err)}")
    return ConnectFault(CODES.get(status, "unknown"), shapes.message_of(err))


def files_refusal(err: RiftError) -> JSONResponse:
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


def user_of(request: Request) -> str:
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


def absolute(path: str, user: str) -> str:
    if path.startswith("/"):
        return path
    return posixpath.join(HOMES.get(user, f"/home/{user}"), path)


class EnvdPart:
    """A part of the data plane: the app's state and the door's sandbox registry."""

    def __init__(self, state: AppState, registry: Registry) -> None:
        self.state = state
        self.registry = registry

    @property
    def deps(self) -> Deps:
        return self.state.deps


class Envd(EnvdPart):

    # -- files and health -------------------------------------------------------------

    def _caller(self, request: Request, operation: str) -> Call:
        """Who calls: the access token, or a URL signed with it (a secured sandbox's
        `download_url`/`upload_url`); blocking."""
        if request.headers.get("x-access-token") or "signature" not in request.query_params:
            return call_of(self.deps, request)
        sandbox, handle = uploads.signed_by(request.query_params, operation, time.time(),
                                            self.registry.held())
        return call_for(self.deps, handle, sandbox)

    async def signed(self, request: Request) -> Response:
        """`/files` at the server's root, where the SDK's `download_url` and
        `upload_url` point (it joins `/files` onto E2B_SANDBOX_URL, dropping `/e2b`):
        signed URLs only, nothing else is there."""
        if "signature" not in request.query_params:
            return JSONResponse(shapes.error_body(404, "Not Found"), status_code=404)
        return await (self.read(request) if request.method == "GET" else self.write(request))

    async def read(self, request: Request) -> Response:
        path = request.query_params.get("path", "")
        try:
            call = await self.state.waiting.run(None, self._caller, request, "read")
            if not path:
                raise InvalidArgument("path", "the file to read")
            read = await self.state.waiting.run(
                None, files.read, self.deps, call.caller, command(
                    c.VmReadFileIn, handle=call.handle, vm_id=call.vm_id,
                    path=absolute(path, user_of(request)), encoding="base64"))
        except PermissionError as denied:
            return JSONResponse(shapes.error_body(401, str(denied)), status_code=401)
        except RiftError as err:
            return files_refusal(err)
        if read.truncated:
            return JSONResponse(shapes.error_body(
                400, f"{path} is larger than the {read.bytes} bytes a read carries here"),
                status_code=400)
        data = base64.b64decode(read.content)
        if data and uploads.wants_gzip(request.headers.get("accept-encoding", "")):
            packed = await self.state.waiting.run(None, uploads.deflate, data)
            return Response(packed, media_type="application/octet-stream",
                            headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
        return Response(data, media_type="application/octet-stream")

    async def write(self, request: Request) -> Response:
        user = user_of(request)
        try:
            call = await self.state.waiting.run(None, self._caller, request, "write")
            metadata = uploads.metadata_of(request.headers.items())
            files = await self._uploads(request, user)
            if metadata:  # refused before any byte is written where it cannot be kept
                await self.state.waiting.run(None, self._settle, call, "/", "root", None,
                                             "command -v python3 >/dev/null 2>&1 || exit "
                                             f"{uploads.NO_METADATA_HERE}")
            written = []
            for path, data in files:
                await self.state.waiting.run(None, self._write, call, path, data, user,
                                             metadata)
                written.append({"name": posixpath.basename(path), "type": "file",
                                "path": path, **({"metadata": metadata} if metadata else {})})
        except PermissionError as denied:
            return JSONResponse(shapes.error_body(401, str(denied)), status_code=401)
        except RiftError as err:
            return files_refusal(err)
        return JSONResponse(written)

    async def _uploads(self, request: Request, user: str) -> list[tuple[str, bytes]]:
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise InvalidArgument("Content-Encoding", "gzip or none")
        kind = request.headers.get("content-type", "").split(";", maxsplit=1)[0].strip().lower()
        if kind == "application/octet-stream":
            path = request.query_params.get("path")
            if not path:
                raise InvalidArgument("path", "an octet-stream upload names its file in ?path=")
            body = await request.body()
            if encoding == "gzip":
                body = await self.state.waiting.run(None, uploads.inflate, body)
            return [(absolute(path, user), body)]
        if encoding == "gzip":
            raise InvalidArgument("Content-Encoding", "gzip is taken on octet-stream uploads")
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
                out.append((absolute(path, user), await value.read()))
        return out

    def _write(self, call: Call, path: str, data: bytes, user: str,
               metadata: dict[str, str] | None) -> None:
        """Write one file (its folder made when it is not there: E2B makes the
        directories a path needs), then give it to `user` and set its metadata."""
        self._put(call, path, data)
        self._settle(call, path, user, metadata)

    def _settle(self, call: Call, path: str, user: str, metadata: dict[str, str] | None,
                script: str | None = None) -> None:
        settled = execs.start(self.deps, call.caller, command(
            c.VmExecIn, handle=call.handle, vm_id=call.vm_id, stdin="", timeout_s=30,
            wait_s=30, command=script or uploads.settle(path, user, metadata)))
        if settled.exit_code == uploads.NO_METADATA_HERE:
            raise InvalidArgument("metadata", "this guest cannot keep file metadata (it "
                                  "needs python3 and a file system with user xattrs)")
        if settled.exit_code != 0:
            raise InvalidArgument("path", f"{path}: written, but not given to {user}: "
                                  f"{settled.stderr.strip()[:200] or settled.status}")

    def _put(self, call: Call, path: str, data: bytes) -> None:
        if len(data) > MAX_CONTENT:
            raise InvalidArgument("content", "at most 16 MiB")
        write = command(c.VmWriteFileIn, handle=call.handle, vm_id=call.vm_id, path=path,
                        content=base64.b64encode(data).decode("ascii"), encoding="base64")
        try:
            files.write(self.deps, call.caller, write)
        except InvalidArgument as err:
            if err.details.get("field") != "path":
                raise
            folder = posixpath.dirname(path)
            made = execs.start(self.deps, call.caller, command(
                c.VmExecIn, handle=call.handle, vm_id=call.vm_id,
                command=f"mkdir -p -- {shlex.quote(folder)}", timeout_s=30, wait_s=30))
            if made.exit_code != 0:
                raise InvalidArgument("path", f"{folder}: could not be made: "
                                      f"{made.stderr.strip()[:200]}") from err
            files.write(self.deps, call.caller, write)

    async def health(self, request: Request) -> Response:
        try:
            call = await self.state.waiting.run(None, call_of, self.deps, request)
            vm = (await self.state.waiting.run(None, vms.get, self.deps, call.caller,
                                               c.VmGetIn(vm_id=call.vm_id))).vm
            over = await self.state.waiting.run(None, sandboxes.ended, self.deps, vm.id)
        except RiftError as err:
            return files_refusal(err)
        # a sleeping VM is a running sandbox (any call wakes it); one paused at its end
        # without autoResume was refused by call_of
        if over or vm.status not in ("running", "sleeping") or \
                vm.task_id != parse_handle(call.handle).task_id:
            return JSONResponse(shapes.error_body(502, "The sandbox was not found"),
                                status_code=502)
        return Response(status_code=204)

