"""What the doors of one app share: the engine (set by the lifespan) and the metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import anyio

from rift.api.metrics import Metrics
from rift.api.waiting import Waiting
from rift.config import Settings
from rift.services.context import Deps


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    _deps: Deps | None = None
    # argon2 checks of passwords at once (RIFT_LOGIN_CONCURRENCY); a login beyond is a 429
    login_checks: threading.BoundedSemaphore = field(init=False)
    # the threads sign-ins run on (twice the checks: the rest are told 429 at once)
    login_threads: anyio.CapacityLimiter = field(init=False)
    # each user's waiting calls, and the threads they run on (RIFT_MAX_WAITING_PER_USER)
    waiting: Waiting = field(init=False)

    def __post_init__(self) -> None:
        self.login_checks = threading.BoundedSemaphore(self.settings.login_concurrency)
        self.login_threads = anyio.CapacityLimiter(2 * self.settings.login_concurrency)
        self.waiting = Waiting(self.settings.max_waiting_per_user)

    @property
    def deps(self) -> Deps:
        if self._deps is None:
            raise RuntimeError("the engine is not started (the app's lifespan starts it)")
        return self._deps

    def start(self, deps: Deps) -> None:
        self._deps = deps
        self.metrics.watch(deps)
