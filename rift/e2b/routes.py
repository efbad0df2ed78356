"""The E2B door's routes, mounted at `/e2b` (so `E2B_API_URL=E2B_SANDBOX_URL=
<rift>/e2b` serves both the SDK's API client and its envd client):

- the control plane (`X-API-Key`: a Rift API token): `POST /v2/sandboxes` (and
  `/sandboxes`), `GET /v2/sandboxes` (and `/sandboxes`), `GET` and `DELETE
  /sandboxes/{id}`, `POST /sandboxes/{id}/timeout`, `POST /v2/sandboxes/{id}/connect`
  (and `/sandboxes/{id}/connect`, `/resume`), `POST /sandboxes/{id}/pause`
  (rift.e2b.lifecycle), `GET /sandboxes/{id}/metrics`, `GET /sandboxes/{id}/logs`
  and `/v2/sandboxes/{id}/logs` (rift.e2b.logs), `/volumes` (rift.e2b.volume_routes),
  template builds through Rift's builder (rift.e2b.template_routes); refusals in
  E2B's shape
  `{"code": <status>, "message": "<Rift's message (code: hint)>"}`.
- the data plane (rift.e2b.envd): `/process.Process/*`, `/filesystem.Filesystem/*`,
  `/files`, `/health`.

Anything else under `/e2b` is answered 501 in E2B's shape: not served yet.
Plain Starlette routes (the door has E2B's shapes, not Rift's contracts).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import Scope

from rift.api.guard import MAX_BODY
from rift.api.state import AppState
from rift.domain.errors import InvalidArgument, RiftError
from rift.e2b import lifecycle, listing, logs, sandboxes, shapes
from rift.e2b.code_interpreter import CodeInterpreterApi
from rift.e2b.deadlines import with_deadlines
from rift.e2b.envd import Envd
from rift.e2b.filesystem import Filesystem
from rift.e2b.gate import CALLER_KEY, PREFIX
from rift.e2b.processes import Processes
from rift.e2b.sandboxes import Registry
from rift.e2b.snapshot_routes import SnapshotApi
from rift.e2b.template_routes import UPLOADS, TemplateApi
from rift.e2b.templates import Setup, Templates
from rift.e2b.volume_routes import VolumeApi
from rift.e2b.watches import Watches

STREAMS = ("/filesystem.Filesystem/WatchDir",)


def body_limit(base: Callable[[Scope], int]) -> Callable[[Scope], int]:
    """`base`, except that an upload to a sandbox's `/files` may be as large as a
    REST file write, and a template's files as large (then held to
    RIFT_BUILD_CONTEXT_MIB by their route)."""
    def limit(scope: Scope) -> int:
        if scope.get("method") == "POST" and scope.get("path") in (PREFIX + "/files", "/files"):
            return MAX_BODY
        if scope.get("method") == "PUT" and str(scope.get("path")).startswith(PREFIX + UPLOADS):
            return MAX_BODY
        return base(scope)
    return limit


def refusal(err: RiftError) -> JSONResponse:
    status = shapes.status_of(err)
    headers = {"Retry-After": str(err.details.get("retry_after_s", 60))} \
        if status == 429 else None
    return JSONResponse(shapes.error_body(status, shapes.message_of(err)), status_code=status,
                        headers=headers)


class Api:
    def __init__(self, state: AppState, registry: Registry) -> None:
        self.state = state
        self.registry = registry

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw:
            return {}
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise InvalidArgument("body", f"is not valid JSON: {exc}") from exc
        if not isinstance(parsed, dict):
            raise InvalidArgument("body", "must be a JSON object")
        return parsed

    async def _call(self, request: Request, work: Callable[..., Any], *args: Any,
                    waits: bool = False) -> Any:
        deps = self.state.deps
        caller = request.scope.get("state", {}).get(CALLER_KEY)  # the gate's (rift.e2b.gate)
        if caller is None:
            caller = await self.state.waiting.run(None, sandboxes.caller_of, deps,
                                                  request.headers.get("x-api-key"))
        return await self.state.waiting.run(caller.user if waits else None, work, deps,
                                            self.registry, caller, *args)

    async def create(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            made = await self._call(request, sandboxes.create, body, waits=True)
        except RiftError as err:
            return refusal(err)
        return JSONResponse(made, status_code=201)

    async def list(self, request: Request) -> Response:
        try:
            found, next_token = await self._call(request, listing.listing,
                                                 dict(request.query_params))
        except RiftError as err:
            return refusal(err)
        return JSONResponse(found, headers={"x-next-token": next_token} if next_token else None)

    async def info(self, request: Request) -> Response:
        try:
            return JSONResponse(await self._call(request, listing.info,
                                                 request.path_params["sandbox"]))
        except RiftError as err:
            return refusal(err)

    async def metrics(self, request: Request) -> Response:
        try:
            return JSONResponse(await self._call(request, listing.metrics,
                                                 request.path_params["sandbox"],
                                                 dict(request.query_params)))
        except RiftError as err:
            return refusal(err)

    async def logs(self, request: Request) -> Response:
        return await self._logs(request, logs.logs_v1)

    async def logs_v2(self, request: Request) -> Response:
        return await self._logs(request, logs.logs_v2)

    async def _logs(self, request: Request, read: Callable[..., Any]) -> Response:
        try:
            return JSONResponse(await self._call(request, read, request.path_params["sandbox"],
                                                 dict(request.query_params)))
        except RiftError as err:
            return refusal(err)

    async def kill(self, request: Request) -> Response:
        try:
            await self._call(request, sandboxes.kill, request.path_params["sandbox"],
                             waits=True)
        except RiftError as err:
            return refusal(err)
        return Response(status_code=204)

    async def timeout(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            await self._call(request, sandboxes.set_timeout, request.path_params["sandbox"],
                             body)
        except RiftError as err:
            return refusal(err)
        return Response(status_code=204)

    async def connect(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            made, resumed = await self._call(request, lifecycle.connect,
                                             request.path_params["sandbox"], body, waits=True)
        except RiftError as err:
            return refusal(err)
        return JSONResponse(made, status_code=201 if resumed else 200)

    async def pause(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            await self._call(request, lifecycle.pause, request.path_params["sandbox"], body,
                             waits=True)
        except RiftError as err:
            return refusal(err)
        return Response(status_code=204)

    async def not_served(self, request: Request) -> Response:
        """What the door does not serve yet, after the key's check (the gate's: 401 first)."""
        return JSONResponse(shapes.error_body(
            501, f"{request.method} {request.url.path} is not served by Rift's E2B door yet "
            "(README: Connect E2B code)"), status_code=501)


def routes(state: AppState, registry: Registry) -> list[Route]:
    api, envd = Api(state, registry), Envd(state, registry)
    procs = Processes(state, registry)
    files = Filesystem(procs)
    settings = state.settings
    templates = Templates(Setup(settings.data_dir, settings.build_context_mib,
                                settings.build_ready_s, settings.public_url),
                          lambda: state.deps)
    everything = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return [
        Route("/v2/sandboxes", api.create, methods=["POST"]),
        Route("/sandboxes", api.create, methods=["POST"]),
        Route("/v2/sandboxes", api.list, methods=["GET"]),
        Route("/sandboxes", api.list, methods=["GET"]),
        Route("/sandboxes/{sandbox}", api.info, methods=["GET"]),
        Route("/sandboxes/{sandbox}", api.kill, methods=["DELETE"]),
        Route("/sandboxes/{sandbox}/metrics", api.metrics, methods=["GET"]),
        Route("/sandboxes/{sandbox}/logs", api.logs, methods=["GET"]),
        Route("/v2/sandboxes/{sandbox}/logs", api.logs_v2, methods=["GET"]),
        Route("/sandboxes/{sandbox}/timeout", api.timeout, methods=["POST"]),
        Route("/v2/sandboxes/{sandbox}/connect", api.connect, methods=["POST"]),
        Route("/sandboxes/{sandbox}/connect", api.connect, methods=["POST"]),
        Route("/sandboxes/{sandbox}/resume", api.connect, methods=["POST"]),
        Route("/sandboxes/{sandbox}/pause", api.pause, methods=["POST"]),
        Route("/process.Process/Start", procs.start, methods=["POST"]),
        Route("/process.Process/Connect", procs.connect, methods=["POST"]),
        Route("/process.Process/List", procs.list, methods=["POST"]),
        Route("/process.Process/SendSignal", procs.signal, methods=["POST"]),
        Route("/process.Process/SendInput", procs.send_input, methods=["POST"]),
        Route("/process.Process/CloseStdin", procs.close_stdin, methods=["POST"]),
        Route("/process.Process/Update", procs.update, methods=["POST"]),
        *Watches(procs).routes(),  # directory watches (rift.e2b.watches)
        *[Route(path, procs.unimplemented_stream, methods=["POST"]) for path in STREAMS],
        Route("/process.Process/{rpc}", procs.unimplemented, methods=["POST"]),
        Route("/filesystem.Filesystem/Stat", files.stat, methods=["POST"]),
        Route("/filesystem.Filesystem/ListDir", files.list_dir, methods=["POST"]),
        Route("/filesystem.Filesystem/MakeDir", files.make_dir, methods=["POST"]),
        Route("/filesystem.Filesystem/Move", files.move, methods=["POST"]),
        Route("/filesystem.Filesystem/Remove", files.remove, methods=["POST"]),
        Route("/filesystem.Filesystem/{rpc}", procs.unimplemented, methods=["POST"]),
        Route("/files", envd.read, methods=["GET"]),
        Route("/files", envd.write, methods=["POST"]),
        Route("/health", envd.health, methods=["GET"]),
        *SnapshotApi(api, refusal).routes(),  # snapshots, forks, network (rift.e2b.snapshots)
        *VolumeApi(api, refusal).routes(),  # volumes (rift.e2b.volumes)
        *TemplateApi(api, refusal, templates).routes(),  # template builds (rift.e2b.templates)
        *CodeInterpreterApi(state, registry).routes(),  # rift.e2b.code_interpreter
        Route("/{rest:path}", api.not_served, methods=everything),
    ]


def mount(app: Starlette, state: AppState) -> None:
    """Serve the door at `/e2b`, ahead of the app's other routes, and keep its
    sandboxes' timeouts while the app runs."""
    settings = state.settings
    registry = Registry(lambda: state.deps, settings.preview_domain, settings.e2b_public_ports)
    app.router.routes.insert(0, Mount(PREFIX, routes=routes(state, registry)))
    app.router.routes.insert(0, Route("/files", Envd(state, registry).signed,
                                      methods=["GET", "POST"]))  # signed file URLs
    app.router.lifespan_context = with_deadlines(app.router.lifespan_context, state, registry)
