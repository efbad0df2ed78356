"""The door's routes for volumes (rift.e2b.volumes): `POST /volumes` (201, E2B's
`VolumeAndToken`), `GET /volumes`, `GET /volumes/{id}` and `DELETE /volumes/{id}`
(204). E2B's volume content API (`/volumecontent/...`: a volume's files without
a sandbox, under the volume's token) is answered 501, before any key is asked
(rift.e2b.gate)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rift.domain.errors import RiftError
from rift.e2b import shapes, volumes
from rift.e2b.snapshot_routes import Caller


class VolumeApi:
    def __init__(self, api: Caller, refusal: Callable[[RiftError], JSONResponse]) -> None:
        self.api = api
        self.refusal = refusal

    async def create(self, request: Request) -> Response:
        try:
            body = await self.api._body(request)
            made = await self.api._call(request, volumes.create, body, waits=True)
        except RiftError as err:
            return self.refusal(err)
        return JSONResponse(made, status_code=201)

    async def listing(self, request: Request) -> Response:
        try:
            return JSONResponse(await self.api._call(request, volumes.listing))
        except RiftError as err:
            return self.refusal(err)

    async def info(self, request: Request) -> Response:
        try:
            return JSONResponse(await self.api._call(request, volumes.info,
                                                     request.path_params["volume"]))
        except RiftError as err:
            return self.refusal(err)

    async def delete(self, request: Request) -> Response:
        try:
            await self.api._call(request, volumes.delete, request.path_params["volume"],
                                 waits=True)
        except RiftError as err:
            return self.refusal(err)
        return Response(status_code=204)

    async def content(self, request: Request) -> Response:
        return JSONResponse(shapes.error_body(
            501, "Rift's E2B door serves no volume content API: mount the volume in a "
            "sandbox (volumeMounts) and use its files (README: Connect E2B code)"),
            status_code=501)

    def routes(self) -> list[Route]:
        return [
            Route("/volumes", self.create, methods=["POST"]),
            Route("/volumes", self.listing, methods=["GET"]),
            Route("/volumes/{volume}", self.info, methods=["GET"]),
            Route("/volumes/{volume}", self.delete, methods=["DELETE"]),
            Route("/volumecontent/{rest:path}", self.content,
                  methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ]
