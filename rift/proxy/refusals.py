"""What the egress proxy refuses, and why: the reasons it counts (read by /metrics)."""

from __future__ import annotations

import threading

REASONS = ("not_listed", "sni_mismatch", "host_mismatch", "host_local", "unresolved",
           "unknown_vm", "bad_request", "bad_hello", "denied")


class Refusals:
    """Refused proxy requests by reason; read by /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(REASONS, 0)

    def add(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


class Unreachable(Exception):
    """An allowed destination that did not answer (502, not a refusal)."""


class Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
