"""create_app(settings): the HTTP process. This issue serves `/healthz`; the MCP
and REST doors come next. A lifespan starts and stops the engine and the sweep."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI

from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.scheduler import start_scheduler
from rift.services.context import Deps


def create_app(settings: Settings, deps: Deps | None = None) -> FastAPI:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = deps if deps is not None else await anyio.to_thread.run_sync(
            build_deps, settings)
        state["deps"] = engine
        scheduler = start_scheduler(engine, settings.sweep_interval_s)
        try:
            yield
        finally:
            scheduler.shutdown(wait=True)
            if deps is None:
                await anyio.to_thread.run_sync(close_deps, engine)

    app = FastAPI(title="Rift", version="0.1.0", lifespan=lifespan)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
