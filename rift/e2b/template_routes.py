"""The door's routes for E2B's template builds (rift.e2b.templates): `POST
/v3/templates` (202), `GET /templates/{id}/files/{hash}` (201), `PUT
/template-uploads/{token}` (the upload URL it answers: no API key, the one-time
token is the key), `POST /v2/templates/{id}/builds/{build}` (202), `GET
/templates/{id}/builds/{build}/status` and `GET /templates/aliases/{alias}`;
refusals in E2B's shape."""

from __future__ import annotations

from collections.abc import Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rift.domain.errors import RiftError
from rift.e2b import shapes
from rift.e2b.gate import UPLOADS
from rift.e2b.snapshot_routes import Caller
from rift.e2b.templates import Templates

__all__ = ["UPLOADS", "TemplateApi"]


class TemplateApi:
    def __init__(self, api: Caller, refusal: Callable[[RiftError], JSONResponse],
                 templates: Templates) -> None:
        self.api, self.refusal, self.templates = api, refusal, templates

    async def request_build(self, request: Request) -> Response:
        try:
            body = await self.api._body(request)
            made = await self.api._call(request, self.templates.request, body)
        except RiftError as err:
            return self.refusal(err)
        return JSONResponse(made, status_code=202)

    async def upload_link(self, request: Request) -> Response:
        base = f"{request.url.scheme}://{request.url.netloc}"
        try:
            made = await self.api._call(request, self.templates.upload_link,
                                        request.path_params["template"],
                                        request.path_params["hash"], base)
        except RiftError as err:
            return self.refusal(err)
        return JSONResponse(made, status_code=201)

    async def upload(self, request: Request) -> Response:
        try:  # the token first: no body is read for a URL Rift did not give
            user, files_hash = await anyio.to_thread.run_sync(
                self.templates.claim, request.path_params["token"])
        except PermissionError as err:
            return JSONResponse(shapes.error_body(403, str(err)), status_code=403)
        try:
            data = await request.body()
            await anyio.to_thread.run_sync(self.templates.upload, user, files_hash, data)
        except RiftError as err:
            return self.refusal(err)
        return Response(status_code=200)

    async def start(self, request: Request) -> Response:
        try:
            body = await self.api._body(request)
            await self.api._call(request, self.templates.start, request.path_params["template"],
                                 request.path_params["build"], body, waits=True)
        except RiftError as err:
            return self.refusal(err)
        return Response(status_code=202)

    async def status(self, request: Request) -> Response:
        try:
            return JSONResponse(await self.api._call(
                request, self.templates.status, request.path_params["template"],
                request.path_params["build"], dict(request.query_params)))
        except RiftError as err:
            return self.refusal(err)

    async def alias(self, request: Request) -> Response:
        try:
            return JSONResponse(await self.api._call(request, self.templates.alias,
                                                     request.path_params["alias"]))
        except RiftError as err:
            return self.refusal(err)

    def routes(self) -> list[Route]:
        return [
            Route("/v3/templates", self.request_build, methods=["POST"]),
            Route("/templates/aliases/{alias}", self.alias, methods=["GET"]),
            Route("/templates/{template}/files/{hash}", self.upload_link, methods=["GET"]),
            Route(UPLOADS + "{token}", self.upload, methods=["PUT"]),
            Route("/v2/templates/{template}/builds/{build}", self.start, methods=["POST"]),
            Route("/templates/{template}/builds/{build}/status", self.status, methods=["GET"]),
        ]
