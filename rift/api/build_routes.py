"""REST `/api/v1` for images from a recipe (SPEC §19): the same contract
(rift/contract/builds.py) and use cases as `rift image build` (`router` here is
REST's router with the volumes', code contexts' and these routes; rift.app installs
it from here).

`POST /images` takes the recipe and, for its COPY sources, a tar of the context
(base64 in `context`, at most RIFT_BUILD_CONTEXT_MIB; the JSON body's own cap,
16 MiB, bounds it too), checks the recipe before any VM starts and answers the
build `running` (202); the build runs in the background, one at a time, and
`GET /builds/{id}?log_from=N` reads it and its log from a character on."""

from __future__ import annotations

import base64
import binascii
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import Path as PathParam
from fastapi import Query, Request

from rift.api.code_routes import router
from rift.api.rest import CallerDep
from rift.api.state import AppState
from rift.contract.builds import BuildGetIn, BuildOut, ImageBuildIn, ImageOut, ImagePublishIn
from rift.domain.errors import InvalidArgument
from rift.services.builds import builder
from rift.services.builds.builder import BuildParts
from rift.services.builds.context import unpack

__all__ = ["router"]


@router.post("/images", response_model=BuildOut, status_code=202,
             summary="build an image of yours from a recipe (a Dockerfile subset)")
def build_image(request: Request, caller: CallerDep, body: ImageBuildIn) -> Any:
    state: AppState = request.app.state.rift
    settings = state.settings
    if body.context is None:
        parts = BuildParts(ready_s=settings.build_ready_s)
        return builder.submit(state.deps, caller, body, parts)
    try:
        archive = base64.b64decode(body.context, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument("context", f"not base64: {exc}") from exc
    folder = Path(tempfile.mkdtemp(prefix="context-", dir=_contexts(settings.data_dir)))
    try:
        context = unpack(archive, folder, settings.build_context_mib)
        parts = BuildParts(context=context, ready_s=settings.build_ready_s,
                           remove_context=True)
        return builder.submit(state.deps, caller, body.model_copy(update={"context": None}),
                              parts)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _contexts(data_dir: Path) -> Path:
    folder = data_dir / "build-contexts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@router.get("/builds/{build_id}", response_model=BuildOut,
            summary="a build of yours, its state and its log from log_from on")
def get_build(request: Request, caller: CallerDep,
              build_id: Annotated[str, PathParam()],
              log_from: Annotated[int, Query(ge=0)] = 0) -> Any:
    state: AppState = request.app.state.rift
    return builder.get(state.deps, caller, BuildGetIn(build_id=build_id, log_from=log_from))


@router.post("/images/{name}/publish", response_model=ImageOut,
             summary="let every user start an image you built")
def publish_image(request: Request, caller: CallerDep,
                  name: Annotated[str, PathParam()]) -> Any:
    state: AppState = request.app.state.rift
    return builder.publish(state.deps, caller, ImagePublishIn(name=name))
