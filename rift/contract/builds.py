"""Images from a recipe (SPEC §19): what a build takes and answers, for every door
(`rift image build NAME --recipe FILE`, `POST /api/v1/images`, the engine's own
callers such as the code contexts' `python` image)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rift.contract.base import Input, NoNul, Output

MAX_RECIPE = 256 * 1024

ImageName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$",
                                 description="The image's name: lower case letters, digits, "
                                 "'.', '_' and '-'."), NoNul]


BuildId = Annotated[str, Field(pattern=r"^build_[a-z2-7]{8}$", description=(
    "A build's id (`build_` + 8 characters), from rift image build or POST /images.")),
                    NoNul]


class ImageBuildIn(Input):
    """Build image `name` from `recipe` (a Dockerfile subset); its COPY sources come
    from the context the door gives beside it (a folder, or a tar on REST)."""

    name: ImageName
    recipe: Annotated[str, Field(min_length=1, max_length=MAX_RECIPE, description=(
        "The recipe: FROM, RUN, COPY, ENV, WORKDIR, USER, ARG, EXPOSE, CMD.")), NoNul]
    no_cache: Annotated[bool, Field(description="Reuse no layer of an earlier build.")] = False
    context: Annotated[str, Field(description=(
        "REST only: the context as a tar, base64 (at most RIFT_BUILD_CONTEXT_MIB)."))] | None = None


class BuildGetIn(Input):
    build_id: BuildId
    log_from: Annotated[int, Field(ge=0, description=(
        "Answer the log from this character on (log_offset of the last answer)."))] = 0


class ImagePublishIn(Input):
    name: ImageName


class BuildView(Output):
    """A build: its state, how many of its steps reused a layer, its error, and its
    log from `log_from` on (`log_offset`: where the next read starts)."""

    build_id: str
    image: str
    owner: str
    state: Literal["running", "succeeded", "failed"]
    steps: int
    cached: int
    created_at: str
    ended_at: str | None
    error: str | None
    log: str
    log_offset: int


class BuildOut(Output):
    build: BuildView


class ImageView(Output):
    name: str
    owner: str
    published: bool
    build_id: str | None


class ImageOut(Output):
    image: ImageView
