"""The door's routes for snapshots, forks and network rules (rift.e2b.snapshots,
rift.e2b.network): `POST /sandboxes/{id}/snapshots` (201, E2B's `SnapshotInfo`),
`GET /snapshots` (paged by `x-next-token`), `DELETE /templates/{id}` (204, or 404
for anything but a snapshot of the caller's), `POST /sandboxes/{id}/fork` (201, one
`{sandbox}` or `{error}` per fork), and `PUT /sandboxes/{id}/network`, answered 501:
a sandbox's egress is set when it is made (QEMU's network and Rift's proxy are
set up with the VM)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rift.domain.errors import RiftError
from rift.e2b import shapes, snapshots


class Caller(Protocol):
    """What the door's API (rift.e2b.routes.Api) offers its parts."""

    async def _body(self, request: Request) -> dict[str, Any]: ...

    async def _call(self, request: Request, work: Callable[..., Any], *args: Any,
                    waits: bool = False) -> Any: ...


class SnapshotApi:
    def __init__(self, api: Caller, refusal: Callable[[RiftError], JSONResponse]) -> None:
        self.api = api
        self.refusal = refusal

    async def create(self, request: Request) -> Response:
        try:
            body = await self.api._body(request)
            made = await self.api._call(request, snapshots.create,
                                        request.path_params["sandbox"], body, waits=True)
        except RiftError as err:
            return self.refusal(err)
        return JSONResponse(made, status_code=201)

    async def listing(self, request: Request) -> Response:
        try:
            found, next_token = await self.api._call(request, snapshots.listing,
                                                     dict(request.query_params))
        except RiftError as err:
            return self.refusal(err)
        return JSONResponse(found, headers={"x-next-token": next_token} if next_token else None)

    async def delete(self, request: Request) -> Response:
        try:
            await self.api._call(request, snapshots.delete, request.path_params["template"],
                                 waits=True)
        except RiftError as err:
            return self.refusal(err)
        return Response(status_code=204)

    async def fork(self, request: Request) -> Response:
        try:
            body = await self.api._body(request)
            made = await self.api._call(request, snapshots.fork,
                                        request.path_params["sandbox"], body, waits=True)
        except RiftError as err:
            return self.refusal(err)
        return JSONResponse(made, status_code=201)

    async def network(self, request: Request) -> Response:
        return JSONResponse(shapes.error_body(
            501, "a sandbox's network rules are set when it is made (Rift's egress, SPEC §13, "
            "is fixed with the VM): create a sandbox with the rules wanted "
            "(README: Connect E2B code)"), status_code=501)

    def routes(self) -> list[Route]:
        return [
            Route("/sandboxes/{sandbox}/snapshots", self.create, methods=["POST"]),
            Route("/snapshots", self.listing, methods=["GET"]),
            Route("/templates/{template}", self.delete, methods=["DELETE"]),
            Route("/sandboxes/{sandbox}/fork", self.fork, methods=["POST"]),
            Route("/sandboxes/{sandbox}/network", self.network, methods=["PUT"]),
        ]
