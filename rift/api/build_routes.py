"""REST `/api/v1` for images from a recipe (SPEC §19): the same contract
(rift/contract/builds.py) and use cases as `rift image build` (`router` here is
REST's router with the volumes', code contexts' and these routes; rift.app installs
it from here).

`POST /images` takes the recipe and, for its COPY sources, a tar of the context
(base64 in `context`, at most RIFT_BUILD_CONTEXT_MIB, as the builder holds every
door's context; the JSON body's own cap,
16 MiB, bounds it too), checks the recipe before any VM starts and answers the
build `running` (202); the build runs in the background, one at a time, and
`GET /builds/{id}?log_from=N` reads it and its log from a character on;
`GET /builds/{id}/log` streams the log (Server-Sent Events) until the build ends."""

from __future__ import annotations

import base64
import binascii
import shutil
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Annotated, Any

from fastapi import Header, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse

from rift.api.code_routes import router
from rift.api.exec_stream import event
from rift.api.rest import CallerDep
from rift.api.state import AppState
from rift.api.waiting import HeldStream
from rift.contract.builds import (
    BuildGetIn,
    BuildId,
    BuildOut,
    BuildView,
    ImageBuildIn,
    ImageName,
    ImageOut,
    ImagePublishIn,
)
from rift.domain.builds import new_build_id
from rift.domain.errors import InvalidArgument
from rift.services.builds import builder
from rift.services.builds.builder import BuildParts
from rift.services.builds.context import context_folder, unpack

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
    build_id = new_build_id()
    folder = context_folder(settings.data_dir, build_id)
    try:
        context = unpack(archive, folder, settings.build_context_mib)
        parts = BuildParts(context=context, ready_s=settings.build_ready_s,
                           remove_context=True, context_mib=settings.build_context_mib,
                           build_id=build_id)
        return builder.submit(state.deps, caller, body.model_copy(update={"context": None}),
                              parts)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


@router.get("/builds/{build_id}", response_model=BuildOut,
            summary="a build of yours, its state and its log from log_from on")
def get_build(request: Request, caller: CallerDep,
              build_id: Annotated[BuildId, PathParam()],
              log_from: Annotated[int, Query(ge=0)] = 0) -> Any:
    state: AppState = request.app.state.rift
    return builder.get(state.deps, caller, BuildGetIn(build_id=build_id, log_from=log_from))


@router.post("/images/{name}/publish", response_model=ImageOut,
             summary="let every user start an image you built")
def publish_image(request: Request, caller: CallerDep,
                  name: Annotated[ImageName, PathParam()]) -> Any:
    state: AppState = request.app.state.rift
    return builder.publish(state.deps, caller, ImagePublishIn(name=name))


POLL_S = 0.5  # how often a build's stream reads its log
QUIET_S = 15.0  # a keep-alive comment after this long without an event
STREAM_S = 3 * 3600  # the longest a build's stream stays open


@router.get("/builds/{build_id}/log", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": (
                "Server-Sent Events: `log` ({text, next_offset}) as the build writes it, "
                "each with an `id` (its next offset) to resume from (Last-Event-ID), then "
                "`end` (the build without its log)")}},
            summary="a build's log as Server-Sent Events until it ends")
async def stream_build(request: Request, caller: CallerDep,
                       build_id: Annotated[BuildId, PathParam()],
                       log_from: Annotated[int, Query(ge=0)] = 0,
                       last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
                       ) -> StreamingResponse:
    state: AppState = request.app.state.rift
    deps = state.deps
    if last_event_id and last_event_id.isdigit() and len(last_event_id) <= 12:
        log_from = int(last_event_id)

    def read(offset: int) -> BuildView:
        return builder.get(deps, caller, BuildGetIn(build_id=build_id, log_from=offset)).build

    give = state.waiting.take(caller.user)  # a stream waits: one of the caller's places
    try:
        first = await state.waiting.run(None, partial(read, log_from))  # a refusal: an answer
    except BaseException:
        give()
        raise
    return HeldStream(state.waiting.iterate(build_events(first, read)), give,
                      media_type="text/event-stream",
                      headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def build_events(view: BuildView, read: Callable[[int], BuildView]) -> Iterator[str]:
    """A build's log as it comes, a comment each quiet QUIET_S, and its end. Runs in
    a worker thread."""
    quiet_since = began = time.monotonic()
    while True:
        if view.log:
            yield event("log", {"text": view.log, "next_offset": view.log_offset},
                        str(view.log_offset))
            quiet_since = time.monotonic()
        if view.state != "running" or time.monotonic() - began > STREAM_S:
            yield event("end", view.model_dump(mode="json", exclude={"log"}))
            return
        if time.monotonic() - quiet_since > QUIET_S:
            yield ": still building\n\n"
            quiet_since = time.monotonic()
        time.sleep(POLL_S)
        view = read(view.log_offset)
