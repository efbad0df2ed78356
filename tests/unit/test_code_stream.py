"""A run streamed as it comes (SPEC §20, rift.services.lifecycle.code_stream, for the
E2B door's `/execute`): over the real rift-code, a cell's parts come in order before
its execution, which is recorded; a guest's hostile parts are capped again across
the stream or refused; an older rift-code (no parts) gives its output at the end."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.code import ExecutionView
from rift.services.context import Deps
from rift.services.lifecycle import code_stream, tasks, vms
from rift.services.ports.code import CodeAnswer
from rift.services.read.code_views import TEXT_CAP, Part
from tests.support.code_guest import HostCode, ScriptedCode
from tests.support.engine import ALICE, refused
from tests.support.fake_guest import fake_guests
from tests.support.vm_rows import give_ssh_address


@pytest.fixture
def guest(tmp_path: Path) -> Iterator[HostCode]:
    started = HostCode(tmp_path)
    yield started
    started.close()


def _stream(deps: Deps, text: str) -> tuple[list[Part], ExecutionView, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    started = code_stream.start(deps, ALICE, command(
        c.VmRunCodeIn, handle=str(opened.handle), vm_id=vm.id, code=text))
    items = list(code_stream.parts(deps, started))
    view = items.pop()
    assert isinstance(view, ExecutionView) and all(isinstance(p, Part) for p in items)
    return [p for p in items if isinstance(p, Part)], view, vm.id


def test_a_cells_parts_come_in_order_then_its_execution_recorded(deps: Deps,
                                                                  guest: HostCode) -> None:
    cdeps = replace(deps, guests=fake_guests(), code=guest)
    found, view, vm_id = _stream(cdeps, "print('a')\nimport sys; print('b', file=sys.stderr)\n"
                                 "display(1)\nprint('c')\n2 + 2")
    assert [(p.kind, p.text or (p.result.data if p.result else None)) for p in found] == [
        ("stdout", "a\n"), ("stderr", "b\n"), ("result", {"text/plain": "1"}),
        ("stdout", "c\n"), ("result", {"text/plain": "4"})]
    assert view.status == "ok" and view.execution_count is not None
    with cdeps.store.read() as tx:
        row = tx.code_contexts.get(vm_id, "default")
    assert row is not None and (row.last_status, row.run_id) == ("ok", None)


def _answer(**more: Any) -> CodeAnswer:
    return CodeAnswer(200, {"run_id": "run_aaaaaaaa", "context_id": "default", "status": "ok",
                            "newest_line": "", **more})


EXECUTION = {"results": [{"data": {"text/plain": "7"}, "is_main_result": True}],
             "stdout": "old\n", "stderr": "", "error": None, "execution_count": 3,
             "truncated": False, "omitted": [], "duration_ms": 5}


def test_hostile_parts_are_capped_across_the_stream_and_malformed_ones_refused(
        deps: Deps) -> None:
    flood = _answer(parts=[{"type": "stdout", "text": "x" * (TEXT_CAP - 10)},
                           {"type": "stdout", "text": "y" * 100},
                           {"type": "result", "data": {"image/png": "A" * (6 << 20)},
                            "is_main_result": False}],
                    parts_seen=3, execution=EXECUTION)
    found, view, _ = _stream(replace(deps, guests=fake_guests(), code=ScriptedCode(flood)), "1")
    assert [len(p.text) for p in found] == [TEXT_CAP - 10, 10]  # the image: omitted
    assert [(o.mime, o.reason[:8]) for o in view.omitted] == [("image/png", "an image")]
    for bad in (_answer(parts=[{"type": "stdout", "text": 5}], parts_seen=1),
                _answer(parts=[], parts_seen=7), _answer(parts="no", parts_seen=0)):
        cdeps = replace(deps, guests=fake_guests(), code=ScriptedCode(bad))
        assert "malformed" in refused("guest_unreachable", lambda d=cdeps: _stream(d, "1")
                                      ).message


def test_an_older_rift_code_without_parts_gives_its_output_at_the_end(deps: Deps) -> None:
    old = _answer(execution=EXECUTION)
    found, view, _ = _stream(replace(deps, guests=fake_guests(), code=ScriptedCode(old)), "1")
    assert [(p.kind, p.text or (p.result.data if p.result else None)) for p in found] == [
        ("stdout", "old\n"), ("result", {"text/plain": "7"})]
    assert view.execution_count == 3


class _Answers(ScriptedCode):
    """A guest that answers each request with the next of `answers` (the last again)."""

    def __init__(self, *answers: CodeAnswer) -> None:
        super().__init__(answers[0])
        self.left = list(answers)

    def request(self, vm: Any, request: Any) -> CodeAnswer:
        return self.left.pop(0) if len(self.left) > 1 else self.left[0]


def test_a_status_that_comes_before_the_runs_end_is_read_on_to_its_end(deps: Deps) -> None:
    early = _answer(parts=[{"type": "stdout", "text": "a\n"}], parts_seen=1)  # no execution
    still = _answer(parts=[], parts_seen=1)
    ended = _answer(parts=[], parts_seen=1, execution=EXECUTION)
    guest = _Answers(early, still, ended)  # the start, then two reads
    found, view, _ = _stream(replace(deps, guests=fake_guests(), code=guest), "1")
    assert [p.text for p in found] == ["a\n"] and view.execution_count == 3
