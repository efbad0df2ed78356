"""Times as people read them: relative ("3 min ago", "in 3 h 59 min") with the
exact UTC time for hovering. `static/boxes.js` keeps the same rules live."""

from __future__ import annotations

from datetime import UTC, datetime

from markupsafe import Markup, escape

MINUTE = 60
HOUR = 3600
DAY = 86400


def parse(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def span(seconds: float) -> str:
    """A duration, coarse: "42 s", "5 min", "3 h 12 min", "2 d 4 h"."""
    s = int(max(0.0, seconds))
    if s < MINUTE:
        return f"{s} s"
    if s < HOUR:
        return f"{s // MINUTE} min"
    if s < DAY:
        hours, minutes = divmod(s // MINUTE, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(s // HOUR, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def relative(at: datetime, now: datetime, kind: str) -> str:
    """``ago`` (a past time), ``until`` (a coming one) or ``age`` (how old)."""
    delta = (now - at).total_seconds()
    if kind == "until":
        return "due now" if delta >= 0 else f"in {span(-delta)}"
    if kind == "age":
        return span(delta)
    return "just now" if delta < 5 else f"{span(delta)} ago"


def exact(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def time_tag(iso: str | None, now: datetime, kind: str = "ago") -> Markup:
    """``<time>`` with the relative text, the exact time on hover, and what the
    page's script needs to keep the text current."""
    if iso is None:
        return Markup("<span class=muted>—</span>")
    at = parse(iso)
    # Built by hand (Markup.format was most of the page's render time); only
    # the ISO text comes from outside this module, and it is escaped.
    return Markup(f'<time datetime="{escape(iso)}" title="{exact(at)}" '  # noqa: S704
                  f'data-rel="{escape(kind)}">{relative(at, now, kind)}</time>')


def duration_words(seconds: int) -> str:
    """A setting's length in words: 14400 → "4 hours"."""
    for unit, name in ((DAY, "day"), (HOUR, "hour"), (MINUTE, "minute")):
        if seconds >= unit and seconds % unit == 0:
            count = seconds // unit
            return f"{count} {name}{'' if count == 1 else 's'}"
    return f"{seconds} seconds"
