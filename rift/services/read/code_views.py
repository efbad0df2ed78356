"""The views of code contexts (SPEC §20), built from what the guest's rift-code
answered: hostile (SPEC §15), so each answer is checked against the contract's shapes
and its caps are applied again here (1 MiB a stream and text form, 4 MiB an image),
whatever the guest claims. (rift.services.read.views builds the views read from the
store; these come from the guest alone.)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from rift.contract.code import (
    ContextView,
    ExecutionError,
    ExecutionView,
    OmittedView,
    ResultView,
)
from rift.domain.clock import iso
from rift.domain.errors import GuestUnreachable

TEXT_CAP = 1 << 20  # a stream's or a text form's characters in one answer
IMAGE_CAP = 4 << 20  # one image's bytes (decoded)
IMAGES = ("image/png",)  # base64 in a bundle (SVG is text)


def execution(vm_id: str, answer: Any) -> tuple[ExecutionView, str]:
    """A run's view from the guest's answer, and its newest output line."""
    try:
        if not isinstance(answer, dict) or not isinstance(answer.get("execution"), dict):
            raise TypeError("no execution")
        newest = answer.get("newest_line")
        view = ExecutionView.model_validate({
            **answer["execution"], "run_id": answer.get("run_id"),
            "context_id": answer.get("context_id"), "status": answer.get("status")})
    except (ValidationError, TypeError) as exc:
        raise GuestUnreachable(vm_id, f"rift-code answered a malformed run: {exc}"[:500]) \
            from exc
    return _capped(view), newest[:200] if isinstance(newest, str) else ""


def _capped(view: ExecutionView) -> ExecutionView:
    truncated = view.truncated or len(view.stdout) > TEXT_CAP or len(view.stderr) > TEXT_CAP
    omitted = list(view.omitted)
    results: list[ResultView] = []
    for result in view.results:
        kept, cut = capped_result(result, omitted)
        truncated = truncated or cut
        if kept is not None:
            results.append(kept)
    return view.model_copy(update={
        "stdout": view.stdout[:TEXT_CAP], "stderr": view.stderr[:TEXT_CAP],
        "results": results, "omitted": omitted, "truncated": truncated})


def capped_result(result: ResultView, omitted: list[OmittedView]
                  ) -> tuple[ResultView | None, bool]:
    """A result with its forms capped (an image over IMAGE_CAP named in `omitted`,
    a text form cut at TEXT_CAP: True), or None when no form is left."""
    data: dict[str, Any] = {}
    truncated = False
    for mime, value in result.data.items():
        size = len(value) * 3 // 4 - value[-2:].count("=") \
            if mime in IMAGES and isinstance(value, str) else len(str(value))
        if mime in IMAGES and size > IMAGE_CAP:
            omitted.append(OmittedView(mime=mime, bytes=size, reason=(
                f"an image may be at most {IMAGE_CAP} bytes")))
        elif isinstance(value, str) and len(value) > TEXT_CAP:
            data[mime], truncated = value[:TEXT_CAP], True
        else:
            data[mime] = value
    kept = ResultView(data=data, is_main_result=result.is_main_result) if data else None
    return kept, truncated


@dataclass(frozen=True)
class Part:
    """One piece of a run's output as it came (SPEC §20, for a door that streams
    it): `stdout` or `stderr` text, a `result`, or the `error`."""

    kind: Literal["stdout", "stderr", "result", "error"]
    text: str = ""
    result: ResultView | None = None
    error: ExecutionError | None = None


@dataclass(frozen=True)
class PartsAnswer:
    """What the guest answered to a read of a run's output as it comes: its status,
    its newest line, the parts after those seen, how many it has sent in all, and
    its whole view once it ended (None while it runs)."""

    status: str
    newest: str
    parts: list[Part]
    seen: int
    ended: ExecutionView | None


class _Streamed(BaseModel):
    type: Literal["stdout", "stderr", "result", "error"]
    text: str = ""
    data: dict[str, Any] | None = None
    is_main_result: bool = False
    name: str = ""
    value: str = ""
    traceback: str = ""


def parts(vm_id: str, answer: Any, seen: int) -> PartsAnswer | None:
    """The parts of a run from the guest's answer to `GET /runs/ID?parts=K`; None
    when its server reads no `parts` (an older rift-code: its answer is the whole
    view, the run's end or its state after the wait)."""
    if isinstance(answer, dict) and "parts" not in answer:
        return None
    try:
        if not isinstance(answer, dict) or not isinstance(answer.get("parts"), list) \
                or not isinstance(answer.get("parts_seen"), int) \
                or answer["parts_seen"] != seen + len(answer["parts"]):
            raise TypeError("no parts")
        said = [_Streamed.model_validate(one) for one in answer["parts"]]
        status = answer.get("status")
        # ended once its whole view comes (a status alone may come a moment before)
        ended = execution(vm_id, answer)[0] \
            if status != "running" and "execution" in answer else None
    except (ValidationError, TypeError) as exc:
        raise GuestUnreachable(vm_id, f"rift-code answered malformed output: {exc}"[:500]) \
            from exc
    newest = answer.get("newest_line")
    found = [Part(kind=one.type, text=one.text) if one.type in ("stdout", "stderr") else
             Part(kind="result", result=ResultView(data=one.data or {},
                                                   is_main_result=one.is_main_result))
             if one.type == "result" else
             Part(kind="error", error=ExecutionError(name=one.name, value=one.value,
                                                     traceback=one.traceback))
             for one in said]
    return PartsAnswer(str(status), newest[:200] if isinstance(newest, str) else "", found,
                       answer["parts_seen"], ended)


def context(vm_id: str, answer: Any) -> ContextView:
    """A context's view from the guest's answer."""
    try:
        if not isinstance(answer, dict):
            raise TypeError("no context")
        at = answer.get("last_run_at")
        return ContextView.model_validate({
            **{k: answer.get(k) for k in ("id", "language", "cwd", "backend", "alive",
                                          "running")},
            "vm_id": vm_id,
            "last_run_at": iso(datetime.fromtimestamp(at, UTC))
            if isinstance(at, int | float) and 0 <= at < 2**33 else None})
    except (ValidationError, TypeError) as exc:
        raise GuestUnreachable(vm_id, f"rift-code answered a malformed context: {exc}"[:500]) \
            from exc


def contexts(vm_id: str, answer: Any) -> list[ContextView]:
    if not isinstance(answer, list) or len(answer) > 1000:
        raise GuestUnreachable(vm_id, "rift-code answered no list of contexts")
    return [context(vm_id, one) for one in answer]
