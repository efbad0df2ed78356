"""The store's port for code contexts (SPEC §20): the engine's record of a VM's
kernels (rift.domain.code_contexts)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from rift.domain.code_contexts import CodeContext, RunEnd


class CodeContextRepository(Protocol):
    def put(self, context: CodeContext) -> None:
        """Write the context as it is (its row replaced, or added)."""
        ...
    def get(self, vm_id: str, context_id: str) -> CodeContext | None: ...
    def of_vms(self, vm_ids: Sequence[str]) -> dict[str, list[CodeContext]]:
        """Every asked VM id is a key (with ``[]`` when it has none), oldest first."""
        ...
    def run_started(self, vm_id: str, context_id: str, run_id: str,
                    until: datetime) -> bool:
        """A run in flight in the context, ending by `until`; False: no such row."""
        ...
    def run_ended(self, vm_id: str, context_id: str, end: RunEnd) -> bool:
        """The context's last run, and its run in flight cleared when it is the end's
        run (any, when None); False: no such row."""
        ...
    def remove(self, vm_id: str, context_id: str | None = None) -> int:
        """Delete the VM's context (all of them when None); answers how many."""
        ...
    def expire_runs(self, now: datetime) -> int:
        """Clear the runs in flight that ended by `now` at the latest; answers how many."""
        ...
