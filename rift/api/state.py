"""What the doors of one app share: the engine (set by the lifespan) and the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from rift.api.metrics import Metrics
from rift.config import Settings
from rift.services.context import Deps


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    _deps: Deps | None = None

    @property
    def deps(self) -> Deps:
        if self._deps is None:
            raise RuntimeError("the engine is not started (the app's lifespan starts it)")
        return self._deps

    def start(self, deps: Deps) -> None:
        self._deps = deps
        self.metrics.watch(deps)
