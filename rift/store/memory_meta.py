"""Installation facts in memory, with the same compare-and-set as SQL."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from rift.store.memory_base import MemoryTxBase


class MemoryMetaQueries(MemoryTxBase):
    def get_meta(self, key: str) -> str | None:
        return self._s.meta.get(key)

    def swap_meta(self, key: str, expected: str | None, value: str) -> bool:
        self._writing("swap_meta")
        if self._s.meta.get(key) != expected:
            return False
        self._s.meta[key] = value
        return True

    def shift_open_tasks(self, seconds: float) -> int:
        self._writing("shift_open_tasks")
        delta = timedelta(seconds=seconds)
        moved = 0
        for task_id, task in list(self._s.tasks.items()):
            if task.is_open:
                self._s.tasks[task_id] = dataclasses.replace(
                    task, last_activity_at=task.last_activity_at + delta)
                moved += 1
        return moved
