"""A run of code whose output a door streams as it comes (SPEC §20: E2B's code
interpreter's `run_code(on_stdout=…, on_result=…)`, whose SDK reads `/execute`'s
lines as they arrive). The run is started as `rift_vm_run_code` starts one
(`start`: the handle, the VM, the run recorded in flight; a refusal before any
output; the guest answers the start itself with the run's first output, or its
end), then `parts` reads its output after what it has seen, each read answered
by the guest as soon as there is some (`GET /runs/ID?parts=K`), until it ends; the
caps are applied again across the reads (1 MiB a stream, the forms of each
result). Its task's activity clock moves while it streams; a reader that goes away
(the generator closed before the end) interrupts the run, as a cancelled call
does, and the context goes on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rift.contract.code import ExecutionView, OmittedView, VmRunCodeIn
from rift.domain.code_contexts import INTERRUPT_GRACE_S, RunStart
from rift.domain.errors import ContextNotFound, InvalidArgument, RiftError
from rift.domain.ids import new_run_id
from rift.domain.model import Task, Vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle import code_records
from rift.services.lifecycle.code import DEFAULT, ask, guest_vm, req
from rift.services.lifecycle.leases import in_flight
from rift.services.ports.watch import STEP_S
from rift.services.read import code_views
from rift.services.read.code_views import TEXT_CAP, Part

SLACK_S = 30.0  # past a run's timeout and the interrupt's grace: its end's last read


@dataclass(frozen=True)
class Started:
    task: Task
    vm: Vm
    run_id: str
    context_id: str
    timeout_s: int
    first: Any  # the guest's answer to the start: its first parts (or its end)


def start(deps: Deps, caller: Caller, cmd: VmRunCodeIn) -> Started:
    """Start the run (refused as `rift_vm_run_code` is); its output comes by `parts`."""
    context_id, run_id = cmd.context_id or DEFAULT, new_run_id()
    task, vm, port = guest_vm(deps, caller, cmd.handle, cmd.vm_id,
                              RunStart(context_id, run_id, cmd.timeout_s))
    try:
        first = ask(port, vm, req("POST", "/runs", STEP_S, {
            "run_id": run_id, "context_id": context_id, "code": cmd.code, "parts": 0,
            "timeout_s": cmd.timeout_s, "wait_ms": int(STEP_S * 1000),
            "env": cmd.env or {}}), context_id)
    except (ContextNotFound, InvalidArgument):  # the guest did not take it
        code_records.run_refused(deps, vm, context_id, run_id)
        raise
    return Started(task, vm, run_id, context_id, cmd.timeout_s, first)


def parts(deps: Deps, run: Started) -> Iterator[Part | ExecutionView]:
    """The run's output as it comes, then its execution at its end (or as it is when
    its time is up). Closed before the end, it interrupts the run."""
    deadline = time.monotonic() + run.timeout_s + INTERRUPT_GRACE_S + SLACK_S
    caps = _Caps()
    seen, view = 0, None
    try:
        with in_flight(deps, run.task.id, deadline - time.monotonic()):
            answer = run.first
            while True:
                left = deadline - time.monotonic()
                got = code_views.parts(run.vm.id, answer, seen)
                if got is None:  # an older rift-code: the whole view, at its end
                    whole, _newest = code_views.execution(run.vm.id, answer)
                    if whole.status != "running" or left <= 0:
                        yield from caps.of_view(whole)
                        view = whole
                        break
                else:
                    seen = got.seen
                    yield from caps.kept(got.parts)
                    if got.ended is not None:
                        view = got.ended
                        break
                    if left <= 0:  # its time is up: as it is now (interrupted below)
                        view = code_views.execution(run.vm.id, ask(deps.code, run.vm, req(
                            "GET", f"/runs/{run.run_id}", 0), run.context_id))[0]
                        break
                step = max(0.0, min(STEP_S, left))
                answer = ask(deps.code, run.vm, req(
                    "GET", f"/runs/{run.run_id}?wait_ms={int(step * 1000)}&parts={seen}",
                    step), run.context_id)
    finally:
        if view is None or view.status == "running":
            _interrupt(deps, run)
    code_records.run_seen(deps, run.vm, view, run.timeout_s)
    yield view.model_copy(update={"omitted": [*view.omitted, *caps.omitted]})


class _Caps:
    """The caps of one answer, applied across the reads of a stream."""

    def __init__(self) -> None:
        self.sent = {"stdout": 0, "stderr": 0}
        self.omitted: list[OmittedView] = []

    def kept(self, found: list[Part]) -> Iterator[Part]:
        for part in found:
            if part.kind in ("stdout", "stderr"):
                text = part.text[:max(0, TEXT_CAP - self.sent[part.kind])]
                self.sent[part.kind] += len(text)
                if text:
                    yield Part(kind=part.kind, text=text)
            elif part.kind == "result" and part.result is not None:
                result, _cut = code_views.capped_result(part.result, self.omitted)
                if result is not None:
                    yield Part(kind="result", result=result)
            else:
                yield part

    def of_view(self, view: ExecutionView) -> Iterator[Part]:
        whole = [Part(kind="stdout", text=view.stdout), Part(kind="stderr", text=view.stderr),
                 *(Part(kind="result", result=r) for r in view.results)]
        if view.error is not None:
            whole.append(Part(kind="error", error=view.error))
        return self.kept([p for p in whole if p.kind not in ("stdout", "stderr") or p.text])


def _interrupt(deps: Deps, run: Started) -> None:
    try:
        ask(deps.code, run.vm, req("POST", f"/contexts/{run.context_id}/interrupt", 0,
                                   {"run_id": run.run_id}), run.context_id)
    except RiftError as exc:
        deps.log.info("run not interrupted", extra={"run_id": run.run_id,
                                                    "error": str(exc)[:200]})
