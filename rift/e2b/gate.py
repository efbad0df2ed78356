"""The E2B door's first check (SPEC §15): who calls, before any byte of a body is
read. rift.api.gate's `TokenGate` runs it for every request under `/e2b`.

- The control plane: `X-API-Key` must be a Rift API token (401 in E2B's shape
  otherwise); the caller found is kept in the request's state for the route.
- The data plane (envd's RPCs and `/files`): `X-Access-Token` must hold the task
  of the sandbox it names, checked as the engine checks a handle (a stale one is
  refused naming the holder, its event recorded), or for `/files` a URL signed
  with that token (checked by the route); `/health` asks nothing, nor a
  template's upload URL (its token checked by its route). E2B's volume content
  API (`/volumecontent/`) sends its volume's token as `Authorization: Bearer`: the
  door answered the caller's API key as that token (rift.e2b.volumes), checked here
  as an `X-API-Key` is. E2B's code interpreter's calls (`/execute`,
  `/contexts`) carry the sandbox's access or traffic token, checked by their routes.
"""

from __future__ import annotations

import anyio
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from rift.api.state import AppState
from rift.domain.errors import HandleRequired, RiftError, Unauthorized
from rift.e2b import sandboxes, shapes
from rift.e2b.envd import fault_of, files_refusal
from rift.e2b.processes import stream_refusal, unary_refusal
from rift.services.context import Caller, Deps
from rift.services.lifecycle import leases

PREFIX = "/e2b"
RPCS = ("/process.", "/filesystem.")
STREAMS = ("/process.Process/Start", "/process.Process/Connect",
           "/filesystem.Filesystem/WatchDir")  # server streams: refused in the stream
DATA_PLANE = (*RPCS, "/files")
OPEN = ("/health",)
# E2B's volume content API: its bearer token is the volume's, which the door answers
# as the caller's API key (rift.e2b.volume_content)
VOLUME_CONTENT = "/volumecontent/"
# E2B's code interpreter's calls (no API key: its SDK sends the sandbox's access or
# traffic token), checked by its routes before they read a body (rift.e2b.code_interpreter)
CODE_INTERPRETER = ("/execute", "/contexts")
# A template's file uploads: the URL's one-time token is the key, checked by the route
# (rift.e2b.template_routes), as E2B's upload URLs carry theirs.
UPLOADS = "/template-uploads/"
CALLER_KEY = "rift_e2b_caller"  # in the request's state


def _data_plane(deps: Deps, token: str | None) -> None:
    if not token:
        raise HandleRequired()  # 401: the sandbox's envdAccessToken is its task's handle
    handle = leases.parse_handle(token)
    with deps.store.read() as tx:
        task = tx.tasks.get(handle.task_id)
    if task is None:
        raise Unauthorized()
    label = task.holder if task.holder and task.holder.startswith("e2b:") else "e2b:envd"
    leases.hold(deps, Caller(task.owner, label), token)


def _signed(path: str, headers: Headers, scope: Scope) -> bool:
    """A `/files` URL signed with the sandbox's token, without the token: the route
    checks the signature (rift.e2b.uploads)."""
    return path == "/files" and not headers.get("x-access-token") and \
        b"signature=" in scope.get("query_string", b"")


async def first_check(state: AppState, scope: Scope) -> Response | None:
    """None to go on to the route; else the refusal to answer, the body unread."""
    path = scope["path"][len(PREFIX):]
    headers = Headers(scope=scope)
    try:
        if path in OPEN or _signed(path, headers, scope) \
                or path in CODE_INTERPRETER or path.startswith(("/contexts/", UPLOADS)):
            return None
        if path.startswith(DATA_PLANE):
            try:
                await anyio.to_thread.run_sync(_data_plane, state.deps,
                                               headers.get("x-access-token"))
            except RiftError as err:  # answered as envd answers that route
                if path in STREAMS:
                    return stream_refusal(fault_of(err))
                return unary_refusal(fault_of(err)) if path.startswith(RPCS) \
                    else files_refusal(err)
            return None
        key = headers.get("x-api-key")
        if path.startswith(VOLUME_CONTENT):
            scheme, _, bearer = headers.get("authorization", "").partition(" ")
            key = bearer.strip() if scheme.lower() == "bearer" else None
        caller = await anyio.to_thread.run_sync(sandboxes.caller_of, state.deps, key)
    except RiftError as err:
        status = shapes.status_of(err)
        return JSONResponse(shapes.error_body(status, shapes.message_of(err)),
                            status_code=status)
    scope.setdefault("state", {})[CALLER_KEY] = caller
    return None
