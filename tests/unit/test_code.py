"""Code contexts in the engine (SPEC §20), over the real rift-code run on this host
(tests/support/code_guest.py) and the real store: state kept between runs, the
default context and contexts of their own, `context_not_found`, an unknown language
named, a run past its wait going on and a stop interrupting it, the watch hearing
the newest line, the caps applied again to what a hostile guest answers, and a
guest without python3."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rift.contract import tools as c
from rift.contract.base import command
from rift.services.context import Deps
from rift.services.lifecycle import code
from rift.services.ports.code import CodeAnswer
from rift.services.ports.watch import Watch
from tests.support.code_guest import HostCode, ScriptedCode, code_vm, run_code
from tests.support.engine import ALICE, BOB, refused
from tests.support.fake_guest import fake_guests


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCode]:
    started = HostCode(tmp_path_factory.mktemp("guest"))
    yield started
    started.close()


@pytest.fixture
def cdeps(deps: Deps, guest: HostCode) -> Deps:
    return replace(deps, guests=fake_guests(), code=guest)


def test_a_run_keeps_its_state_in_the_default_context_and_answers_its_forms(
        cdeps: Deps) -> None:
    handle, vm_id = code_vm(cdeps)
    first = run_code(cdeps, handle, vm_id, "total = 40\nprint('set')").execution
    assert (first.status, first.stdout, first.results, first.context_id) == \
        ("ok", "set\n", [], "default")
    assert first.run_id.startswith("run_")
    second = run_code(cdeps, handle, vm_id, "total + 2").execution
    assert [(r.data, r.is_main_result) for r in second.results] == [({"text/plain": "42"}, True)]
    assert second.execution_count == (first.execution_count or 0) + 1
    env = run_code(cdeps, handle, vm_id, "import os; os.environ['GREETING']",
               env={"GREETING": "hello"}).execution
    assert env.results[0].data["text/plain"] == "'hello'"
    refused("invalid_argument", lambda: run_code(cdeps, handle, vm_id, "1", env={"1x": "no"}))
    failed = run_code(cdeps, handle, vm_id, "int('x')").execution
    assert failed.status == "error" and failed.error is not None
    assert (failed.error.name, failed.error.value) == (
        "ValueError", "invalid literal for int() with base 10: 'x'")


def test_contexts_are_made_listed_restarted_and_deleted_and_unknown_ones_refused(
        cdeps: Deps, tmp_path: Path) -> None:
    handle, vm_id = code_vm(cdeps)
    made = code.new_context(cdeps, ALICE, command(c.VmCodeContextNewIn, handle=handle,
                                                  vm_id=vm_id, cwd=str(tmp_path))).context
    assert made.id.startswith("ctx_") and (made.vm_id, made.cwd, made.alive) == \
        (vm_id, str(tmp_path), True)
    run_code(cdeps, handle, vm_id, "mine = 1", context_id=made.id)
    where = run_code(cdeps, handle, vm_id, "import os; os.getcwd()", context_id=made.id)
    assert where.execution.results[0].data["text/plain"] == repr(str(tmp_path))
    missing = run_code(cdeps, handle, vm_id, "'mine' in globals()").execution  # default: apart
    assert missing.results[0].data["text/plain"] == "False"
    listed = code.list_contexts(cdeps, ALICE, command(c.VmCodeContextListIn, handle=handle,
                                                      vm_id=vm_id)).contexts
    assert {made.id, "default"} <= {x.id for x in listed}
    assert next(x for x in listed if x.id == made.id).last_run_at is not None
    code.restart(cdeps, ALICE, command(c.VmCodeContextIn, handle=handle, vm_id=vm_id,
                                       context_id=made.id))
    after = run_code(cdeps, handle, vm_id, "'mine' in globals()", context_id=made.id).execution
    assert after.results[0].data["text/plain"] == "False"
    gone = code.delete(cdeps, ALICE, command(c.VmCodeContextIn, handle=handle, vm_id=vm_id,
                                             context_id=made.id)).context
    assert (gone.id, gone.alive) == (made.id, False)
    for call in (
            lambda: run_code(cdeps, handle, vm_id, "1", context_id=made.id),
            lambda: code.restart(cdeps, ALICE, command(c.VmCodeContextIn, handle=handle,
                                                       vm_id=vm_id, context_id=made.id)),
            lambda: code.delete(cdeps, ALICE, command(c.VmCodeContextIn, handle=handle,
                                                      vm_id=vm_id, context_id=made.id))):
        err = refused("context_not_found", call)
        assert err.details["context_id"] == made.id
        assert "rift_vm_code_context_list" in err.hint


def test_an_unknown_language_is_refused_naming_the_languages_and_other_users_see_no_vm(
        cdeps: Deps) -> None:
    handle, vm_id = code_vm(cdeps)
    err = refused("invalid_argument", lambda: run_code(cdeps, handle, vm_id, "1", language="ruby"))
    assert err.details["field"] == "language" and "python" in err.message
    refused("invalid_argument", lambda: code.new_context(cdeps, ALICE, command(
        c.VmCodeContextNewIn, handle=handle, vm_id=vm_id, language="r")))
    refused("task_not_found", lambda: code.run(cdeps, BOB, command(
        c.VmRunCodeIn, handle=handle, vm_id=vm_id, code="1")))


def test_a_run_past_its_wait_goes_on_and_a_stop_interrupts_it_leaving_the_context(
        cdeps: Deps) -> None:
    handle, vm_id = code_vm(cdeps)
    run_code(cdeps, handle, vm_id, "kept = 'here'")
    slow = run_code(cdeps, handle, vm_id, "import time\nprint('started', flush=True)\n"
                "while True: time.sleep(0.05)", wait_s=0).execution
    assert slow.status == "running"
    code.interrupt(cdeps, ALICE, handle, f"{vm_id}/default")
    after = run_code(cdeps, handle, vm_id, "kept").execution  # waits for the interrupted run
    assert (after.status, after.results[0].data["text/plain"]) == ("ok", "'here'")


def test_a_run_past_its_wait_is_read_on_to_its_end_and_an_unknown_one_refused(
        cdeps: Deps) -> None:
    handle, vm_id = code_vm(cdeps)
    slow = run_code(cdeps, handle, vm_id, "import time\ntime.sleep(0.5)\nprint('done')\n7",
                wait_s=0).execution
    assert slow.status == "running"
    read = code.get_run(cdeps, ALICE, command(c.VmRunCodeGetIn, handle=handle, vm_id=vm_id,
                                              run_id=slow.run_id, wait_s=10)).execution
    assert (read.run_id, read.status, read.stdout) == (slow.run_id, "ok", "done\n")
    assert read.results[0].data["text/plain"] == "7"
    err = refused("invalid_argument", lambda: code.get_run(cdeps, ALICE, command(
        c.VmRunCodeGetIn, handle=handle, vm_id=vm_id, run_id="run_aaaaaaaa")))
    assert err.details["field"] == "run_id"


def test_a_watched_run_hears_its_newest_line_and_its_stop_interrupts_the_kernel(
        cdeps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rift.services.lifecycle.code.STEP_S", 0.2)
    handle, vm_id = code_vm(cdeps)
    watch = Watch()
    answers: list[c.RunCodeOut] = []
    runner = threading.Thread(target=lambda: answers.append(code.run(
        cdeps, ALICE, command(c.VmRunCodeIn, handle=handle, vm_id=vm_id, code=(
            "import time\nfor i in range(1000):\n    print('step', i, flush=True)\n"
            "    time.sleep(0.05)"), wait_s=30), watch)))
    runner.start()
    deadline = time.monotonic() + 10
    while not watch.message.startswith("step") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watch.target.startswith(f"{vm_id}/default/run_")
    assert watch.message.startswith("step ")
    watch.stop()
    code.interrupt(cdeps, ALICE, handle, watch.target)  # what the door's stop does
    runner.join(10)
    assert not runner.is_alive()
    ran = answers[0].execution
    assert ran.status in ("running", "interrupted")
    later = run_code(cdeps, handle, vm_id, "i").execution
    assert later.status == "ok" and int(later.results[0].data["text/plain"]) < 999


def test_a_run_whose_watch_stopped_before_it_began_interrupts_itself_and_no_other(
        cdeps: Deps) -> None:
    """A cancel that came before the guest had the run (an MCP task cancelled as it
    starts) finds nothing to interrupt; the run interrupts itself once started, and
    only itself: the next run of the context goes on."""
    handle, vm_id = code_vm(cdeps)
    run_code(cdeps, handle, vm_id, "kept = 'here'")
    watch = Watch()
    watch.stop()
    ran = code.run(cdeps, ALICE, command(c.VmRunCodeIn, handle=handle, vm_id=vm_id, code=(
        "import time\nwhile True: time.sleep(0.05)"), wait_s=30), watch).execution
    assert ran.status == "running"  # as the guest had it when the wait stopped
    after = run_code(cdeps, handle, vm_id, "kept", wait_s=15).execution
    assert (after.status, after.results[0].data["text/plain"]) == ("ok", "'here'")
    ended = code.get_run(cdeps, ALICE, command(c.VmRunCodeGetIn, handle=handle, vm_id=vm_id,
                                               run_id=ran.run_id)).execution
    assert ended.status == "interrupted"


def test_a_timeout_interrupts_the_kernel_and_the_context_goes_on(cdeps: Deps) -> None:
    handle, vm_id = code_vm(cdeps)
    run_code(cdeps, handle, vm_id, "n = 7")
    out = run_code(cdeps, handle, vm_id, "while True: pass", timeout_s=1).execution
    assert out.status == "timed_out" and out.error is not None
    assert out.error.name == "KeyboardInterrupt"
    assert run_code(cdeps, handle, vm_id, "n").execution.results[0].data["text/plain"] == "7"


def _hostile(execution: dict[str, object]) -> CodeAnswer:
    return CodeAnswer(200, {"run_id": "run_aaaaaaaa", "context_id": "default", "status": "ok",
                            "newest_line": "x" * 5000, "execution": execution})


def test_what_a_guest_answers_is_capped_again_and_a_malformed_answer_is_refused(
        deps: Deps) -> None:
    big_png = base64.b64encode(bytes(5 << 20)).decode()
    flood = _hostile({"results": [{"data": {"text/plain": "p", "image/png": big_png,
                                            "text/html": "h" * (2 << 20)},
                                   "is_main_result": True}],
                      "stdout": "o" * (3 << 20), "stderr": "", "error": None,
                      "execution_count": 1, "truncated": False, "omitted": [],
                      "duration_ms": 5})
    cdeps = replace(deps, guests=fake_guests(), code=ScriptedCode(flood))
    handle, vm_id = code_vm(cdeps)
    out = run_code(cdeps, handle, vm_id, "1").execution
    assert len(out.stdout) == 1 << 20 and out.truncated
    assert out.results[0].data == {"text/plain": "p", "text/html": "h" * (1 << 20)}
    assert [(o.mime, o.bytes) for o in out.omitted] == [("image/png", 5 << 20)]
    cdeps = replace(cdeps, code=ScriptedCode(_hostile({"results": "no"})))
    assert "malformed" in refused("guest_unreachable", lambda: run_code(cdeps, handle, vm_id,
                                                                    "1")).message
    cdeps = replace(cdeps, code=ScriptedCode(None))
    err = refused("invalid_argument", lambda: run_code(cdeps, handle, vm_id, "1"))
    assert "python3" in err.message


def test_a_control_plane_without_guest_access_runs_no_code(deps: Deps) -> None:
    handle, vm_id = code_vm(deps)
    refused("guest_unreachable", lambda: run_code(deps, handle, vm_id, "1"))


def test_the_guest_servers_http_is_read_without_trusting_it() -> None:
    from rift.guest.code import parse_answer
    from rift.guest.errors import GuestError

    good = parse_answer(b"HTTP/1.0 404 Not Found\r\nContent-Length: 2\r\n\r\n{\"a\": 1}", "vm_x")
    assert (good.status, good.body) == (404, {"a": 1})
    for bad in (b"", b"HTTP/1.0 200 OK\r\n", b"SSH-2.0 hi\r\n\r\n{}", b"HTTP/1.0 2000 x\r\n\r\n{}",
                b"HTTP/1.0 200 OK\r\n\r\nnot json", b"HTTP/1.0 200 OK\r\n\r\n" + b"[" * 100_000):
        with pytest.raises(GuestError):
            parse_answer(bad, "vm_x")



def test_a_run_the_guest_refuses_is_not_recorded_in_flight(deps: Deps, guest: HostCode) -> None:
    cdeps = replace(deps, guests=fake_guests(), code=ScriptedCode(None))  # no python3
    handle, vm_id = code_vm(cdeps)
    refused("invalid_argument", lambda: run_code(cdeps, handle, vm_id, "1"))
    with cdeps.store.read() as tx:
        assert tx.code_contexts.of_vms([vm_id]) == {vm_id: []}
    cdeps = replace(cdeps, code=guest)
    refused("context_not_found", lambda: run_code(cdeps, handle, vm_id, "1",
                                              context_id="ctx_aaaaaaaa"))
    run_code(cdeps, handle, vm_id, "1")
    with cdeps.store.read() as tx:
        [row] = tx.code_contexts.of_vms([vm_id])[vm_id]
    assert (row.id, row.run_id, row.last_status) == ("default", None, "ok")
