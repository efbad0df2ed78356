"""Guest work of the background jobs (the sweep's exec ends, usage's network
counters), bounded per VM (SPEC §15): a hostile or stalled guest costs its own
VM's share of a run and nothing else.

Each VM's work runs in a small pool of threads, so a guest that stalls holds one
worker for its calls' deadlines while the others go on; within a VM, work stops
at the VM's time budget or at its first unreachable answer, and what is left
waits for the next run (the scans rotate, so it is not always the same that waits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from rift.domain.errors import GuestUnreachable

T = TypeVar("T")
R = TypeVar("R")

VM_BUDGET_S = 5.0  # a VM's guest work per run, beyond which the rest waits for the next
WORKERS = 4  # VMs served at once


def per_vm(groups: dict[str, list[T]], work: Callable[[T, float], R | None], *,
           budget_s: float = VM_BUDGET_S, workers: int = WORKERS) -> list[R]:
    """`work(item, seconds left)` on each item of each VM's group (a VM id: its
    items), in order within a VM, up to its budget (each call is given what is left
    of it, as its deadline) or its first GuestUnreachable; answers what the calls
    answered (Nones dropped)."""

    def one_vm(items: list[T]) -> list[R]:
        deadline = time.monotonic() + budget_s
        done: list[R] = []
        for item in items:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                answer = work(item, left)
            except GuestUnreachable:
                break  # the guest does not answer now: its other items wait
            if answer is not None:
                done.append(answer)
        return done

    if not groups:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(groups)),
                            thread_name_prefix="rift-guest-work") as pool:
        return [answer for answers in pool.map(one_vm, groups.values()) for answer in answers]


def grouped(items: Iterable[T], vm_id: Callable[[T], str]) -> dict[str, list[T]]:
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(vm_id(item), []).append(item)
    return groups
