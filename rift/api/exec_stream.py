"""The events of an exec's stream (`GET /execs/{id}/stream`, SPEC §10) as
Server-Sent Events: its output as it comes, each with an `id` (`<stdout>-<stderr>`
offsets) to resume from (`Last-Event-ID`), a comment each quiet `STREAM_WAIT_S`
(a keep-alive), then its end, or a refusal that ends the stream. The route is
REST's (`rest.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from rift.contract.base import MAX_OFFSET
from rift.contract.views import ExecView
from rift.domain.errors import RiftError


def resumed(last_event_id: str | None) -> tuple[int, int] | None:
    """The offsets in an event id this stream sent (`<stdout>-<stderr>`)."""
    parts = (last_event_id or "").split("-")
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 19 for p in parts):
        return None
    return min(int(parts[0]), MAX_OFFSET), min(int(parts[1]), MAX_OFFSET)


def exec_events(view: ExecView, read: Callable[[int, int], ExecView]) -> Iterator[str]:
    """The events of one exec's stream: its output as it comes, a comment each quiet
    `STREAM_WAIT_S` (a keep-alive), and its end. Runs in a worker thread."""
    while True:
        said = False
        for name in ("stdout", "stderr"):
            text: str = getattr(view, name)
            if text:
                data: dict[str, Any] = {"text": text,
                                        "next_offset": getattr(view, f"{name}_offset")}
                if view.truncated:
                    data["truncated"] = True
                yield event(name, data, f"{view.stdout_offset}-{view.stderr_offset}")
                said = True
        if view.status != "running":
            yield event("end", view.model_dump(mode="json", exclude=_OUTPUT))
            return
        if not said:
            yield ": still running\n\n"
        try:
            view = read(view.stdout_offset, view.stderr_offset)
        except RiftError as exc:
            yield event("refused", {"error": exc.to_dict()})
            return


_OUTPUT = {"stdout", "stderr"}
STREAM_WAIT_S = 15  # the longest quiet between two events (a comment keeps proxies open)


def event(name: str, data: dict[str, Any], event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
