"""Builds and the images they make (SPEC §19): values the store keeps and the
engine (rift.services.builds) changes only through their methods.

A build has a life, saved with one compare-and-set on its state
(``tx.builds.save(new, was=old)``)::

    from       method                     to
    (none)     -                          running   (the host's one build at a time)
    running    logged(lines)              running   (its log grows; bounded)
    running    succeeded(now)             succeeded (its image is there)
    running    failed(why, now)           failed    (no image; the layers before stay)

A restart of `rift serve` fails a build it finds `running` (`failed`, "cut by a
restart"): the guest it ran in went with the task that held it.

An image a build made (``tx.images``) is its builder's until published; a layer is
a hidden image (`layer-<key>`) that only its owner's builds start from.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from rift.domain.errors import check_from

BuildState = Literal["running", "succeeded", "failed"]
ImageKind = Literal["image", "layer"]
MAX_LOG_CHARS = 256 * 1024  # the newest part of a build's log is kept
LAYER_PREFIX = "layer-"


@dataclass(frozen=True)
class Build:
    id: str
    image: str
    owner: str
    host: str
    state: BuildState
    recipe: str
    no_cache: bool
    created_at: datetime
    ended_at: datetime | None = None
    log: str = ""
    error: str | None = None
    steps: int = 0  # the recipe's steps (after FROM)
    cached: int = 0  # of which a layer was reused

    def logged(self, lines: str, cached: int | None = None) -> Build:
        check_from("build", self.id, self.state, ("running",), "logged")
        log = (self.log + lines)[-MAX_LOG_CHARS:]
        return replace(self, log=log, cached=self.cached if cached is None else cached)

    def succeeded(self, now: datetime) -> Build:
        check_from("build", self.id, self.state, ("running",), "succeeded")
        return replace(self, state="succeeded", ended_at=now)

    def failed(self, why: str, now: datetime) -> Build:
        check_from("build", self.id, self.state, ("running",), "failed")
        log = (self.log + f"failed: {why}\n")[-MAX_LOG_CHARS:]
        return replace(self, state="failed", ended_at=now, error=why, log=log)


@dataclass(frozen=True)
class OwnedImage:
    """An image a build made: whose it is, whether everyone may start it, and (a
    layer) the key it was made for."""

    name: str
    owner: str
    kind: ImageKind
    published: bool
    build_id: str | None
    layer_key: str | None
    created_at: datetime

    def visible_to(self, user: str) -> bool:
        if self.kind == "layer":
            return False  # only builds start from layers (rift.services.builds)
        return self.published or self.owner == user

    def publish(self) -> OwnedImage:
        return replace(self, published=True)


def new_build_id() -> str:
    """`build_` + 8 lowercase base32 characters, as rift.domain.ids makes ids."""
    return "build_" + base64.b32encode(secrets.token_bytes(5)).decode("ascii").lower()


def layer_name(key: str) -> str:
    """The hidden image name of the layer with `key`: 24 hex digits are 96 bits."""
    return LAYER_PREFIX + key[:24]
