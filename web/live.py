"""The page's live stream: Server-Sent Events, one stream per open page.

Each tick (``RIFT_LIVE_POLL_S``, 1 s by default) asks the store for its change
mark: one indexed query, the newest event id and the latest activity of any
open task. Every state change appends an event and every touch moves a last
activity, so a change made through any replica sharing the database moves the
mark. Only then is the person's page read again; only when what it shows
differs (a digest of the task views) is the live region re-rendered and sent,
with ``id: <mark>~<digest>`` so that a reconnecting browser (``Last-Event-ID``)
is not sent what it already shows.

The stream ends when the browser goes away, when the session ends (an event
``gone`` sends the page to the login), when the server shuts down, and after
``MAX_STREAM_S`` (the browser reconnects on its own). Store reads and
rendering run in worker threads, never on the event loop.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from fastapi import Request

from rift.services.access import sessions
from rift.services.context import Deps
from rift.services.read import boxes

SESSION_CHECK_S = 10.0
KEEPALIVE_S = 15.0
MAX_STREAM_S = 600.0
RETRY_MS = 2000


def server_exiting() -> bool:
    """True once uvicorn was told to stop (its SIGTERM/SIGINT handler is a bound
    method of the server; an open stream would otherwise hold the shutdown)."""
    handler = signal.getsignal(signal.SIGTERM)
    server = getattr(handler, "__self__", None)
    return bool(getattr(server, "should_exit", False))


def sse(event: str, data: str, event_id: str | None = None) -> str:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.extend(f"data: {line}" for line in data.splitlines() or [""])
    return "\n".join(lines) + "\n\n"


@dataclass
class Watch:
    """What one stream knows its browser shows."""

    mark: str | None
    digest: str | None

    @classmethod
    def parse(cls, version: str | None) -> Watch:
        mark, sep, digest = (version or "").partition("~")
        if not sep or len(version or "") > 200:
            return cls(None, None)
        return cls(mark, digest)


@dataclass(frozen=True)
class Feed:
    """What an open page's stream reads, how often (`poll_s`), and how it renders the
    live region."""

    deps: Deps
    poll_s: float
    render: Callable[[boxes.BoxesPage], str]


async def stream(request: Request, feed: Feed, user: str, session_id: str, since: str | None
                 ) -> AsyncIterator[str]:
    deps, poll_s, render = feed.deps, feed.poll_s, feed.render
    watch = Watch.parse(since)
    started = last_check = last_sent = time.monotonic()
    yield f"retry: {RETRY_MS}\n\n"
    while not server_exiting() and time.monotonic() - started < MAX_STREAM_S:
        if await request.is_disconnected():
            return
        mark = await anyio.to_thread.run_sync(boxes.change_mark, deps)
        if mark != watch.mark:
            page = await anyio.to_thread.run_sync(boxes.read_page, deps, user)
            watch.mark = page.mark
            if page.digest != watch.digest:
                watch.digest = page.digest
                html = await anyio.to_thread.run_sync(render, page)
                last_sent = time.monotonic()
                yield sse("page", html, page.version)
        now = time.monotonic()
        if now - last_check >= SESSION_CHECK_S:
            last_check = now
            if await anyio.to_thread.run_sync(sessions.session_user, deps, session_id) != user:
                yield sse("gone", "signed out")
                return
        if now - last_sent >= KEEPALIVE_S:
            last_sent = now
            yield ": keep-alive\n\n"
        await anyio.sleep(poll_s)
