"""The live stream and the time texts, on a SQLite store and a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import anyio
import pytest
from fastapi import Request

from rift.contract import tools as c
from rift.domain.clock import FakeClock
from rift.services.access import accounts, sessions
from rift.services.context import Caller, Deps
from rift.services.lifecycle import tasks
from rift.services.read import boxes
from web import live, timefmt

ADA = Caller("ada", "mcp:claude-code")
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Browser:
    """Stands in for the request: goes away after ``ticks`` checks."""

    def __init__(self, ticks: int) -> None:
        self.ticks = ticks

    async def is_disconnected(self) -> bool:
        self.ticks -= 1
        return self.ticks < 0


def collect(deps: Deps, session_id: str, since: str | None, ticks: int,
            between: Any = None) -> list[str]:
    """Run a stream for ``ticks`` ticks; ``between`` runs after the first tick."""
    sent: list[str] = []

    async def main() -> None:
        request = cast(Request, Browser(ticks))
        feed = live.Feed(deps, 0.001,
                         lambda page: f"<p>{len(page.open)} open</p>\n<p>{page.digest}</p>")
        events = live.stream(request, feed, "ada", session_id, since)
        async for chunk in events:
            sent.append(chunk)
            if between is not None and chunk.startswith("event: page"):
                between()

    anyio.run(main)
    return sent


@pytest.fixture
def session_id(deps: Deps) -> str:
    accounts.add_user(deps, "ada", "a long password")
    return sessions.log_in(deps, sessions.LoginAttempt("ada", "a long password", "127.0.0.1"),
                           3600).session_id


def pages(sent: list[str]) -> list[str]:
    return [c for c in sent if c.startswith("event: page")]


def test_a_new_stream_sends_the_page_once_then_only_changes(deps: Deps, session_id: str) -> None:
    tasks.new(deps, ADA, c.TaskNewIn(name="one"))
    opened: list[str] = []

    def open_another() -> None:
        if not opened:
            opened.append(tasks.new(deps, ADA, c.TaskNewIn(name="two")).task.id)

    sent = collect(deps, session_id, None, 20, open_another)
    assert sent[0] == "retry: 2000\n\n"
    assert len(pages(sent)) == 2
    assert "data: <p>1 open</p>\ndata: <p>" in pages(sent)[0]
    assert "data: <p>2 open</p>" in pages(sent)[1]


def test_a_browser_showing_the_current_version_is_sent_nothing(deps: Deps,
                                                              session_id: str) -> None:
    tasks.new(deps, ADA, c.TaskNewIn(name="one"))
    version = boxes.read_page(deps, "ada").version
    assert pages(collect(deps, session_id, version, 10)) == []


def test_another_users_change_moves_the_mark_but_sends_nothing(deps: Deps,
                                                              session_id: str) -> None:
    tasks.new(deps, ADA, c.TaskNewIn(name="one"))
    version = boxes.read_page(deps, "ada").version
    tasks.new(deps, Caller("bob", "mcp:x"), c.TaskNewIn(name="bob's"))
    assert boxes.read_page(deps, "ada").version != version  # the mark moved …
    assert pages(collect(deps, session_id, version, 10)) == []  # … the page did not


def test_the_stream_tells_the_page_when_the_session_ends(
        deps: Deps, session_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "SESSION_CHECK_S", 0.0)
    sessions.log_out(deps, session_id)
    sent = collect(deps, session_id, None, 50)
    assert sent[-1] == "event: gone\ndata: signed out\n\n"


def test_a_malformed_version_is_treated_as_none() -> None:
    assert live.Watch.parse("x" * 500) == live.Watch(None, None)
    assert live.Watch.parse("12.34~abcd") == live.Watch("12.34", "abcd")
    assert live.Watch.parse(None) == live.Watch(None, None)


def test_sse_frames_every_line_of_the_data() -> None:
    assert live.sse("page", "a\nb", "7") == "event: page\nid: 7\ndata: a\ndata: b\n\n"
    assert live.sse("gone", "") == "event: gone\ndata: \n\n"


def test_the_read_of_the_page_is_newest_activity_first(deps: Deps, clock: FakeClock) -> None:
    first = tasks.new(deps, ADA, c.TaskNewIn(name="first"))
    clock.advance(120)
    tasks.new(deps, ADA, c.TaskNewIn(name="second"))
    clock.advance(120)
    tasks.get(deps, ADA, c.TaskGetIn(handle=first.handle))
    assert [t.name for t in boxes.read_page(deps, "ada").open] == ["first", "second"]


@pytest.mark.parametrize(("seconds", "kind", "text"), [
    (2, "ago", "just now"), (42, "ago", "42 s ago"), (300, "ago", "5 min ago"),
    (3 * 3600 + 12 * 60, "ago", "3 h 12 min ago"), (7200, "ago", "2 h ago"),
    (2 * 86400 + 4 * 3600, "ago", "2 d 4 h ago"), (-(4 * 3600 - 60), "until", "in 3 h 59 min"),
    (10, "until", "due now"), (90, "age", "1 min"),
])
def test_times_read_as_people_say_them(seconds: int, kind: str, text: str) -> None:
    assert timefmt.relative(T0 - timedelta(seconds=seconds), T0, kind) == text


def test_a_time_tag_carries_the_exact_time_and_escapes() -> None:
    tag = timefmt.time_tag("2026-01-01T11:57:00Z", T0)
    assert tag == ('<time datetime="2026-01-01T11:57:00Z" title="2026-01-01 11:57:00 UTC" '
                   'data-rel="ago">3 min ago</time>')
    assert timefmt.duration_words(14400) == "4 hours"
    assert timefmt.duration_words(90) == "90 seconds"
