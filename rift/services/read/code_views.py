"""The views of code contexts (SPEC §20), built from what the guest's rift-code
answered: hostile (SPEC §15), so each answer is checked against the contract's shapes
and its caps are applied again here (1 MiB a stream and text form, 4 MiB an image),
whatever the guest claims. (rift.services.read.views builds the views read from the
store; these come from the guest alone.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from rift.contract.code import ContextView, ExecutionView, OmittedView, ResultView
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
        data: dict[str, Any] = {}
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
        if data:
            results.append(ResultView(data=data, is_main_result=result.is_main_result))
    return view.model_copy(update={
        "stdout": view.stdout[:TEXT_CAP], "stderr": view.stderr[:TEXT_CAP],
        "results": results, "omitted": omitted, "truncated": truncated})


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
