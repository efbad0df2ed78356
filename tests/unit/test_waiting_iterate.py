"""`Waiting.iterate` (rift.api.waiting): a stream's blocking generator runs on the
waiting calls' threads, its end too: when the client goes mid-stream, the
generator's `finally` (an E2B watch kills its watcher in the guest there) runs on
a worker thread, never on the event loop, which every other call needs."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import anyio

from rift.api.waiting import Waiting


def test_a_generator_left_mid_stream_ends_on_a_worker_thread_and_the_loop_stays_free() -> None:
    ended_on: list[str] = []
    beats: list[float] = []

    def stream() -> Iterator[int]:
        try:
            yield 1
            time.sleep(0.5)  # a long poll in flight when the client goes
            yield 2
        finally:
            ended_on.append(threading.current_thread().name)
            time.sleep(0.5)  # the guest call of its end

    async def main() -> None:
        async def consume() -> None:
            async for _ in Waiting(4).iterate(stream()):
                pass

        async def heartbeat() -> None:
            while True:
                beats.append(time.monotonic())
                await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            with anyio.move_on_after(0.2):  # the client goes
                await consume()
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert ended_on and ended_on[0] != threading.main_thread().name, ended_on
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert gaps and max(gaps) < 0.3, f"the event loop stalled {max(gaps):.2f} s"


def test_a_generator_read_to_its_end_ends_once() -> None:
    ended = []

    def stream() -> Iterator[int]:
        try:
            yield from (1, 2, 3)
        finally:
            ended.append(True)

    async def main() -> list[int]:
        return [item async for item in Waiting(4).iterate(stream())]

    assert anyio.run(main) == [1, 2, 3]
    assert ended == [True]
