"""Hostile guests' and clients' benchmark (issue #26, SPEC §15), on qemu:///system
with two `tiny` guests (TCG here) behind a real `rift serve` (tests.support's):
mallory is root in one and does her worst, alice owns the other.

1. alice's calls one after another (`rift_vm_exec` of `true` on her VM,
   `rift_task_get`, `GET /healthz`; tests.support.hostile's probe; and, as the
   floor, `true` on an open raw paramiko connection to her VM with her task's
   key, which shows what the host's own load costs without Rift): p50 and p99 on
   three sides of each hostile case, side by side in one run: quiet (nobody else
   calling), ordinary (mallory's calls, the case's own, on her guest doing
   nothing hostile: what a neighbour's ordinary use costs alice on this machine)
   and hostile (the same calls while her guest does its worst). Each side gets
   WINDOW_S (40 s by default, RIFT_BENCH_HOSTILE_WINDOW_S to change: some 330
   calls of each kind on this 2-core machine, so a p99 is its 4th-slowest call;
   each row says how many calls and how many of the slowest the p99 rests on) in
   ROUNDS turns (RIFT_BENCH_HOSTILE_ROUNDS, 4 by default) taken quiet, ordinary,
   hostile, then the other way round, so that the machine's own drift (other
   work coming and going on the two cores) falls on every side alike, with
   SETTLE_S after each turn of calls; a case that cannot be undone (the fork
   bomb) has one turn of each; the load average is printed at each case's start
   and end. While mallory calls, two of her callers (bench.hostile_callers), each
   a process of its own at nice 19 (an agent's client on another machine), keep
   calling `rift_vm_exec` on her VM, each pausing PACE_S between calls, on one
   MCP session as an agent's client keeps it. Goal: alice's p99 while mallory's
   guest does its worst within 1.5x the ordinary side's, what the attack costs
   her (mallory's callers run on both sides, so the ratio isolates the guest's
   hostility); against quiet too, printed beside it: it adds the cost of a
   neighbour's ordinary calls on one 2-core machine, which no guest causes.
   The cases: a fake exec helper that never reads its stdin (8 MiB sent each
   call), floods, never exits, or prints a view line built for backtracking; a
   console flood; a new SSH host key; a full root tmpfs; a fork bomb (last: her
   VM is destroyed after it). RIFT_BENCH_HOSTILE_CASES picks some:
   comma-separated words, a case runs when its name contains one of them
   (`fork,tmpfs,console`); all by default.
2. The memory of `rift serve` (VmRSS, and its peak VmHWM) before and after a
   34 MiB JSON body sent with no token, to /mcp and to a REST route (goal: no
   growth past 64 MiB).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import print_table, work_dir
from bench.execs import _open_raw, _raw
from bench.hostile_callers import pressure
from tests.support.hostile import FLOOR, KINDS, GuestRoot, Probe, Window, one_call, rss_mib
from tests.support.servers import Server, real_vms_missing, start_real_server, stop_server
from tests.support.witnesses import our_domains, remove_domain

WINDOW_S = float(os.environ.get("RIFT_BENCH_HOSTILE_WINDOW_S") or 40)  # of each side
ROUNDS = int(os.environ.get("RIFT_BENCH_HOSTILE_ROUNDS") or 4)  # turns each side takes
SETTLE_S = 3.0  # after a hostile turn, before the next quiet one
TARGET_P99 = 1.5
BODY_MIB, TARGET_GROWTH_MIB = 34, 64.0


def progress(text: str) -> None:
    print(f"[hostile] {text}", file=sys.stderr, flush=True)


@dataclass
class Mallory:
    server: Server
    token: str
    handle: str
    task_id: str
    vm: dict[str, Any]

    def root(self) -> GuestRoot:
        return GuestRoot(self.vm["ssh"]["port"], self.server.data_dir / "keys" / self.task_id)

    def call_args(self, exec_args: dict[str, Any]) -> dict[str, Any]:
        """One of her `rift_vm_exec` calls' arguments (`true` unless the case says)."""
        return {"handle": self.handle, "vm_id": self.vm["id"], "command": "true",
                "wait_s": 2, **exec_args}


@dataclass(frozen=True)
class Case:
    name: str
    start: Callable[[GuestRoot], object]
    stop: Callable[[GuestRoot], object]
    exec_args: dict[str, Any]
    undone: bool = True  # `stop` leaves the guest as it was: it can take turns
    ordinary_args: dict[str, Any] | None = None  # her calls on the ordinary side, if not these


def _nothing(_: GuestRoot) -> None:
    return None


def _fill(root: GuestRoot) -> None:
    root.run("dd if=/dev/zero of=/fill bs=1M", 120)  # it ends with "No space left"


CASES = [
    Case("helper never reads 8 MiB stdin", lambda r: r.fake_helper("silent"),
         lambda r: r.real_helper(), {"command": "cat", "stdin": "x" * (8 << 20)},
         # the same 8 MiB in, nothing kept: a real helper keeps each exec's output in
         # her guest's root tmpfs, and some 30 `cat`s of it a turn would fill it
         ordinary_args={"command": "cat >/dev/null", "stdin": "x" * (8 << 20)}),
    Case("helper floods its output", lambda r: r.fake_helper("endless"),
         lambda r: r.real_helper(), {}),
    Case("helper never exits", lambda r: r.fake_helper("silent"),
         lambda r: r.real_helper(), {}),
    Case("helper prints `rift-exec ` + 60 `a=`", lambda r: r.fake_helper("catastrophic"),
         lambda r: r.real_helper(), {}),
    Case("console flood (yes > /dev/console)",
         lambda r: r.spawn("timeout -s KILL 600 yes console flood > /dev/console"),
         lambda r: r.must("killall -q yes; true"), {"command": "echo hi"}),
    Case("new SSH host key", lambda r: r.change_host_key(),
         lambda r: r.change_host_key(back=True), {}),
    Case("root tmpfs full", _fill,
         lambda r: r.must("rm -f /fill"), {"command": "echo hi"}),
    Case("fork bomb", lambda r: r.spawn("f() { f | f & }; f"), _nothing, {}, undone=False),
]


def _chosen() -> list[Case]:
    """The cases RIFT_BENCH_HOSTILE_CASES names (all when it is unset or empty)."""
    words = [w.strip() for w in os.environ.get("RIFT_BENCH_HOSTILE_CASES", "").split(",")
             if w.strip()]
    return [c for c in CASES if not words or any(w in c.name for w in words)]


ORDINARY = "her calls on a guest doing nothing hostile"


@dataclass
class Sides:
    """A case's samples on each side: nobody else calling, mallory's calls on a guest
    that does nothing hostile (`ordinary`), her calls while her guest does its worst."""
    quiet: Window
    ordinary: Window
    hostile: Window


def _turns(probe: Probe, mallory: Mallory, case: Case) -> tuple[Sides, list[Any]]:
    """The case's three sides in turns of WINDOW_S / ROUNDS each, taken quiet,
    ordinary, hostile, then the other way round, and so on (one turn each, in that
    order, when the case cannot be undone), each side's turns' samples together;
    and her answers in the hostile turns."""
    rounds = ROUNDS if case.undone else 1
    sides, answers = Sides(Window(), Window(), Window()), []
    ordinary = Case(ORDINARY, _nothing, _nothing,
                    case.exec_args if case.ordinary_args is None else case.ordinary_args)
    for turn in range(rounds):
        order = ("quiet", "ordinary", "hostile")
        for side in order if turn % 2 == 0 else order[::-1]:
            if side == "quiet":
                with probe.window(WINDOW_S / rounds) as window:
                    pass
            else:
                window, theirs = _calling(probe, mallory, ordinary if side == "ordinary"
                                          else case, WINDOW_S / rounds)
                answers += theirs if side == "hostile" else []
                time.sleep(SETTLE_S)
            getattr(sides, side).samples += window.samples
    return sides, answers


def _calling(probe: Probe, mallory: Mallory, case: Case,
             seconds: float) -> tuple[Window, list[Any]]:
    """alice's samples while mallory's callers call and her guest does `case`."""
    root = mallory.root()
    case.start(root)
    try:
        with pressure(mallory.server.url, mallory.token,
                      mallory.call_args(case.exec_args)) as answers, \
                probe.window(seconds) as window:
            pass
    finally:
        case.stop(root)
    return window, list(answers)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _rests_on(window: Window, kind: str) -> str:
    """The window's calls of a kind and how many of its slowest the p99 rests on, as
    "n/k" (the calls at or above it: the p99 is the k-th slowest)."""
    n = len(window.of(kind))
    return f"{n}/{n - min(n - 1, round(0.99 * (n - 1)))}"


def _rows(name: str, sides: Sides) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    quiet, ordinary, hostile = sides.quiet, sides.ordinary, sides.hostile
    for kind in (*KINDS, FLOOR):
        if not (quiet.of(kind) and ordinary.of(kind) and hostile.of(kind)):
            rows.append((name, kind, *["-"] * 7, "no samples"))
            continue
        errors = [s.error for s in hostile.of(kind) if not s.ok]
        rows.append((name, kind, _ms(quiet.p50(kind)), _ms(quiet.p99(kind)),
                     _ms(ordinary.p99(kind)), _ms(hostile.p50(kind)),
                     _ms(hostile.p99(kind)),
                     f"{hostile.p99(kind) / quiet.p99(kind):.2f}x",
                     f"{hostile.p99(kind) / ordinary.p99(kind):.2f}x",
                     " -> ".join(_rests_on(w, kind) for w in (quiet, ordinary, hostile)),
                     f"{len(errors)} failed, as: {max(errors, key=errors.count)[:160]}"
                     if errors else ""))
    return rows


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _body(size_mib: int) -> bytes:
    filler = b"a" * ((size_mib << 20) - 16)
    return b'{"x": "' + filler + b'"}'


def _memory(server: Server, pid: int) -> list[tuple[str, ...]]:
    body = _body(BODY_MIB)
    rows: list[tuple[str, ...]] = []
    for path in ("/mcp", "/api/v1/tasks"):
        before, peak_before = rss_mib(pid), rss_mib(pid, "VmHWM")
        began = time.perf_counter()
        try:
            answer = httpx.post(server.url + path, content=body, timeout=120, headers={
                "Content-Type": "application/json", "Accept":
                "application/json, text/event-stream"})
            status = str(answer.status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        took = time.perf_counter() - began
        time.sleep(1)
        after, peak = rss_mib(pid), rss_mib(pid, "VmHWM")
        rows.append((f"POST {path}, {BODY_MIB} MiB, no token", status, f"{took:.2f}",
                     f"{before:.0f}", f"{after:.0f}", f"{after - before:+.0f}",
                     f"{peak - peak_before:+.0f}", f"< {TARGET_GROWTH_MIB:.0f}"))
    return rows


def _boot(server: Server, token: str, name: str) -> tuple[str, str, dict[str, Any]]:
    code, _, opened = one_call(server.url, token, "rift_task_new", 60, name=name)
    assert code is None, opened
    code, _, made = one_call(server.url, token, "rift_vm_new", 300, handle=opened["handle"],
                             image="tiny")
    assert code is None and made["vm"]["status"] == "running", made
    return opened["handle"], opened["task"]["id"], made["vm"]


def main() -> None:
    missing = real_vms_missing()
    if missing is not None:
        print(f"hostile: skipped ({missing})")
        return
    with work_dir("rift-bench-hostile-") as tmp:
        # alice's probe starts some 8 execs a second for the whole run: past the default
        # exec budget (3,600 an hour) in a run of all the cases
        proc, server = start_real_server(Path(tmp), RIFT_VM_BOOT_TIMEOUT_S="120",
                                         RIFT_LOG_LEVEL="WARNING",
                                         RIFT_RATE_EXEC_NEW_PER_H="1000000")
        try:
            memory = _memory(server, proc.pid)
            mallory_token = server.new_token("mallory", "bench")
            alice_token = server.new_token("alice", "bench")
            mallory = Mallory(server, mallory_token, *_boot(server, mallory_token, "mallory"))
            alice_handle, alice_task, alice_vm = _boot(server, alice_token, "alice")
            raw = _open_raw(alice_vm["ssh"]["port"], server.data_dir / "keys" / alice_task)
            probe = Probe(server.url, alice_token, alice_handle, alice_vm["id"],
                          floor=lambda: _raw(raw, "true")).start()
            rows: list[tuple[str, ...]] = []
            theirs: list[tuple[str, ...]] = []
            loads: list[tuple[str, ...]] = []
            try:
                for case in _chosen():
                    progress(f"{case.name}: {WINDOW_S:.0f} s quiet, ordinary and hostile,"
                             f" in {ROUNDS if case.undone else 1} turns each")
                    began_load = _load()
                    sides, answers = _turns(probe, mallory, case)
                    rows += _rows(case.name, sides)
                    loads.append((case.name, began_load, _load()))
                    codes = sorted({str(code) for code, _ in answers})
                    slowest = max((took for _, took in answers), default=0.0)
                    theirs.append((case.name, str(len(answers)), ", ".join(codes),
                                   f"{slowest:.1f}"))
                one_call(server.url, mallory_token, "rift_vm_destroy", 60,
                         handle=mallory.handle, vm_id=mallory.vm["id"])
            finally:
                probe.stop()
                raw.close()
            for token, handle in ((mallory_token, mallory.handle),
                                  (alice_token, alice_handle)):
                one_call(server.url, token, "rift_task_close", 120, handle=handle)
        finally:
            stop_server(proc)
            for record in our_domains(server).values():  # after a failed run
                remove_domain(record.name)
    print_table("alice's calls, quiet against while mallory's guest does its worst (ms)",
                rows, ("case", "call", "quiet p50", "quiet p99", "ordinary p99",
                       "hostile p50", "hostile p99", "p99 / quiet", "p99 / ordinary",
                       "calls/p99 rests on, quiet -> ordinary -> hostile", "failed"))
    print(f"\ngoal: hostile p99 within {TARGET_P99}x ordinary (mallory's same calls on a"
          " guest doing nothing hostile: what her attack costs alice; / quiet adds what a"
          f" neighbour's ordinary calls cost on this machine); {WINDOW_S:.0f} s of"
          f" each side (RIFT_BENCH_HOSTILE_WINDOW_S) in {ROUNDS} turns taken in turn"
          " (RIFT_BENCH_HOSTILE_ROUNDS); \"n/k\": a side's n calls of that kind, its p99"
          " the k-th slowest")
    print_table("load average (1, 5, 15 min) at each case's quiet start and hostile end",
                loads, ("case", "start", "end"))
    print_table("mallory's own rift_vm_exec calls meanwhile (wait_s 2)", theirs,
                ("case", "calls", "codes (None: answered)", "slowest s"))
    print_table(f"rift serve's memory and a {BODY_MIB} MiB body with no token (MiB)", memory,
                ("request", "answer", "s", "RSS before", "RSS after", "growth",
                 "peak (VmHWM) growth", "goal"))


if __name__ == "__main__":
    main()
