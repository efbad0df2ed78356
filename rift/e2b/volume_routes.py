"""The door's routes for volumes (rift.e2b.volumes): `POST /volumes` (201, E2B's
`VolumeAndToken`), `GET /volumes`, `GET /volumes/{id}` and `DELETE /volumes/{id}`
(204); and E2B's volume content API (`/volumecontent/{id}/dir`, `/path` and
`/file`: a detached volume's files without a sandbox, rift.e2b.volume_content),
whose bearer token rift.e2b.gate checks as an API key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rift.contract.base import MAX_CONTENT
from rift.domain.errors import InvalidArgument, RiftError
from rift.domain.volumes import PathMissing, PathTaken
from rift.e2b import shapes, volume_content, volumes
from rift.e2b.snapshot_routes import Caller


class VolumeApi:
    def __init__(self, api: Caller, refusal: Callable[[RiftError], JSONResponse]) -> None:
        self.api = api
        self.refusal = refusal

    async def create(self, request: Request) -> Response:
        try:
            body = await self.api._body(request)
            made = await self.api._call(request, volumes.create, body,
                                        request.headers.get("x-api-key"), waits=True)
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
                                                     request.path_params["volume"],
                                                     request.headers.get("x-api-key")))
        except RiftError as err:
            return self.refusal(err)

    async def delete(self, request: Request) -> Response:
        try:
            await self.api._call(request, volumes.delete, request.path_params["volume"],
                                 waits=True)
        except RiftError as err:
            return self.refusal(err)
        return Response(status_code=204)

    async def _content(self, request: Request, work: Callable[..., Any], *args: Any,
                       status: int = 200) -> Response:
        """A content call: its JSON answer (or bytes, or none: 204) with `status`."""
        try:
            asked = volume_content.Asked(request.path_params["volume"],
                                         dict(request.query_params))
            done = await self.api._call(request, work, asked, *args, waits=True)
        except (PathMissing, PathTaken) as err:
            return JSONResponse(shapes.error_body(err.status, shapes.message_of(err)),
                                status_code=err.status)
        except RiftError as err:
            return self.refusal(err)
        if done is None:
            return Response(status_code=204)
        if isinstance(done, bytes):
            return Response(done, media_type="application/octet-stream")
        return JSONResponse(done, status_code=status)

    async def list_dir(self, request: Request) -> Response:
        return await self._content(request, volume_content.listing)

    async def make_dir(self, request: Request) -> Response:
        return await self._content(request, volume_content.make_dir, status=201)

    async def stat(self, request: Request) -> Response:
        return await self._content(request, volume_content.stat)

    async def set_meta(self, request: Request) -> Response:
        try:
            body = await self.api._body(request)
        except RiftError as err:
            return self.refusal(err)
        return await self._content(request, volume_content.set_meta, body)

    async def remove(self, request: Request) -> Response:
        return await self._content(request, volume_content.remove)

    async def read(self, request: Request) -> Response:
        return await self._content(request, volume_content.read)

    async def write(self, request: Request) -> Response:
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_CONTENT:
                return self.refusal(InvalidArgument(
                    "body", f"at most {MAX_CONTENT} bytes written without a sandbox: mount "
                    "the volume in one (volumeMounts) for more"))
        return await self._content(request, volume_content.write, bytes(data), status=201)

    def routes(self) -> list[Route]:
        return [
            Route("/volumes", self.create, methods=["POST"]),
            Route("/volumes", self.listing, methods=["GET"]),
            Route("/volumes/{volume}", self.info, methods=["GET"]),
            Route("/volumes/{volume}", self.delete, methods=["DELETE"]),
            Route("/volumecontent/{volume}/dir", self.list_dir, methods=["GET"]),
            Route("/volumecontent/{volume}/dir", self.make_dir, methods=["POST"]),
            Route("/volumecontent/{volume}/path", self.stat, methods=["GET"]),
            Route("/volumecontent/{volume}/path", self.set_meta, methods=["PATCH"]),
            Route("/volumecontent/{volume}/path", self.remove, methods=["DELETE"]),
            Route("/volumecontent/{volume}/file", self.read, methods=["GET"]),
            Route("/volumecontent/{volume}/file", self.write, methods=["PUT"]),
        ]
