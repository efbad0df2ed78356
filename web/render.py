"""The page's HTML, rendered by Jinja2 with autoescaping on for every template:
task names, holder labels and VM names are other agents' text and are only
ever rendered as text."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from rift.contract.views import VmView
from rift.domain.model import DESTROYABLE_VM_STATUSES
from rift.services.read.boxes import BoxesPage
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


def used(used_bytes: int | None) -> str:
    """A volume's used bytes as sampled on its host: MiB below a GiB, else GiB."""
    if used_bytes is None:
        return "–"
    if used_bytes < 1 << 30:
        return f"{used_bytes / (1 << 20):.0f} MiB"
    return f"{used_bytes / (1 << 30):.1f} GiB"


SPARK_W, SPARK_H = 60, 16


def sparkline(values: list[float | None], top: float, label: str) -> Markup:
    """A small line chart (inline SVG) of `values` between 0 and `top`, newest at the
    right; gaps (None) are skipped. Its label says what it shows, for screen readers."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    step = SPARK_W / max(1, len(values) - 1)
    points = " ".join(f"{i * step:.1f},{SPARK_H - min(v, top) / top * (SPARK_H - 1) - 0.5:.1f}"
                      for i, v in known) if top > 0 else ""
    # Only numbers and our own words go in: escaped all the same.
    return Markup(  # noqa: S704
        f'<svg class="spark" viewBox="0 0 {SPARK_W} {SPARK_H}" width="{SPARK_W}" '
        f'height="{SPARK_H}" role="img" aria-label="{escape(label)}">'
        f'<polyline points="{points}"/></svg>')


def usage_cell(vm: VmView, history: list[tuple[float, float | None, int | None]]
               ) -> Markup:
    """The Boxes page's `Use` cell of a VM: CPU and memory charts and their latest
    figures, or a dash before the first sample; a sleeping VM (SPEC §17) says what it
    would hold awake."""
    stats = vm.stats
    if vm.status == "sleeping":
        awake = f"asleep · {vm.vcpus} vCPU, {vm.memory_mib} MiB awake"
        return Markup('<span class="muted asleep" title="asleep: only its disk counts on its '
                      'host; any call wakes it">{}</span>').format(awake)
    if stats is None:
        return Markup('<span class="muted">–</span>')
    cpu = [c for _at, c, _m in history]
    memory = [float(m) if m is not None else None for _at, _c, m in history]
    cpu_now = "–" if stats.cpu_pct is None else f"{stats.cpu_pct:.0f}%"
    memory_now = "–" if stats.memory_used_mib is None else f"{stats.memory_used_mib} MiB"
    memory_top = float(max([vm.memory_mib, *(m for m in memory if m is not None)]))
    cpu_chart = sparkline(cpu, 100.0, f"CPU over the last {len(cpu)} samples")
    memory_chart = sparkline(memory, memory_top, f"memory over the last {len(memory)} samples")
    parts = [
        f'<span class="use use-cpu" title="CPU, % of its vCPUs">{cpu_chart}'
        f'<span class="use-now">{escape(cpu_now)}</span></span>',
        f'<span class="use use-memory" title="memory in use on its host">{memory_chart}'
        f'<span class="use-now">{escape(memory_now)}</span></span>',
    ]
    return Markup("".join(parts))  # noqa: S704


def sleeps(sleep_after_s: int, sleep: str) -> str:
    """The Boxes page's `Sleeps` fact of a task (SPEC §17): when its quiet VMs sleep."""
    if sleep_after_s == 0:
        return "never"
    when = f"after {timefmt.duration_words(sleep_after_s)} quiet"
    return f"{when}, execs running or not" if sleep == "always" else f"{when} with no exec running"


@cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      auto_reload=False)
    env.globals.update(time_tag=timefmt.time_tag, size=size, usage_cell=usage_cell, used=used,
                       sleeps=sleeps,
                       reasons=CLOSE_REASONS,
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
