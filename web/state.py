"""What the Boxes page needs of the app that installs it, typed here so that web
imports no module of rift.api (the dependency points one way: the app installs
the page, `web.router.install`, handing it its state and its held streams).

The app's state fits `PageState` as it is: the engine, the settings, the sign-in
limits and each user's budget of waiting calls (an open page's live stream holds
one of its user's places, SPEC §15)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
from fastapi import Request
from fastapi.responses import Response

from rift.config import Settings
from rift.services.context import Deps


class Places(Protocol):
    """Each user's waiting calls: `take` answers the function that gives the place
    back, or refuses with TooManyWaiting."""

    def take(self, user: str) -> Callable[[], None]: ...


class PageState(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def deps(self) -> Deps: ...

    @property
    def login_checks(self) -> threading.BoundedSemaphore: ...  # argon2 checks at once

    @property
    def login_threads(self) -> anyio.CapacityLimiter: ...  # the threads sign-ins run on

    @property
    def waiting(self) -> Places: ...


class HeldStream(Protocol):
    """A streaming answer that gives its place back (`give`) when it ends, however
    it ends: the app's own, the same as its other streams'."""

    def __call__(self, content: AsyncIterator[str], give: Callable[[], None], *,
                 media_type: str, headers: dict[str, str]) -> Response: ...


@dataclass(frozen=True)
class Page:
    state: PageState
    held_stream: HeldStream


def page_of(request: Request) -> Page:
    """What `install` was given, from the app the request came to."""
    page: Page = request.app.state.boxes_page
    return page
