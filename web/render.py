"""The page's HTML, rendered by Jinja2 with autoescaping on for every template:
task names, holder labels and VM names are other agents' text and are only
ever rendered as text."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from rift.domain.model import DESTROYABLE_VM_STATUSES
from rift.services.boxes import BoxesPage
from web import timefmt

TEMPLATES = Path(__file__).resolve().parent / "templates"
CLOSE_REASONS = {
    "closed": "closed by an agent",
    "idle": "idle: closed itself",
    "operator": "closed by an operator",
}


def size(vcpus: int, memory_mib: int) -> str:
    memory = f"{memory_mib // 1024} GiB" if memory_mib % 1024 == 0 else f"{memory_mib} MiB"
    return f"{vcpus} vCPU · {memory}" if vcpus == 1 else f"{vcpus} vCPUs · {memory}"


@cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      auto_reload=False)
    env.globals.update(time_tag=timefmt.time_tag, size=size, reasons=CLOSE_REASONS,
                       shown_statuses=DESTROYABLE_VM_STATUSES)
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def live_region(page: BoxesPage, now: datetime, connect: dict[str, str]) -> str:
    """The part of the page the live stream replaces: open and closed tasks."""
    return render("_live.html", page=page, now=now, connect=connect)


def boxes_page(page: BoxesPage, now: datetime, connect: dict[str, str], form_token: str,
               idle_s: int) -> str:
    # The live region is rendered once, by an autoescaping template: already safe.
    live = Markup(live_region(page, now, connect))  # noqa: S704
    return render("boxes.html", page=page, live=live, form_token=form_token, user=page.user,
                  idle=timefmt.duration_words(idle_s))
