"""create_app(settings): the one HTTP process. MCP at `/mcp`, REST at `/api/v1`,
`/healthz`, `/metrics`, the Boxes page at `/`, the E2B door at `/e2b`, the egress
proxy beside them. Nothing is built at import time; the lifespan starts and stops
the engine, the sweep and the MCP session manager. It sits above every door
(rift/api, web, rift/e2b, rift/proxy), as bootstrap.py sits above the adapters,
so no door imports another's package to be installed."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rift.api.auth import rest_caller
from rift.api.build_routes import router  # REST's router: volumes', code and builds' routes
from rift.api.errors import install_error_handlers
from rift.api.exposures import ExposureProxy, redact
from rift.api.gate import TokenGate, body_limit
from rift.api.guard import BodyGuard
from rift.api.mcp.server import mount_mcp
from rift.api.metrics import Metrics, door_of
from rift.api.rebinding import RebindingGuard, allowed_hosts, security_settings
from rift.api.state import AppState
from rift.api.waiting import HeldStream
from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.e2b import gate as e2b_gate
from rift.e2b import routes as e2b
from rift.e2b.ports import SandboxPorts
from rift.guest.egress_deny import EgressDeny
from rift.proxy.guests import GuestsOnThisHost
from rift.proxy.server import EgressProxy
from rift.scheduler import PoolFiller, start_scheduler
from rift.services.access import accounts
from rift.services.background.heartbeat import resume
from rift.services.background.sweeps import sweep
from rift.services.builds import restarts
from rift.services.builds.context import CONTEXTS
from rift.services.context import Caller, Deps
from web.router import install as install_web

log = logging.getLogger("rift.http")


class AccessLog:
    """One JSON line per request: method, path, status, milliseconds. Never
    headers or query strings (a handle or token could ride in either). It also
    keeps the gauge of requests in flight, by door: a stream whose client went
    away must leave it."""

    def __init__(self, app: ASGIApp, metrics: Metrics | None = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.metrics is not None:
            in_flight = self.metrics.in_flight.labels(door_of(scope["path"]))
            in_flight.inc()
            try:
                await self._logged(scope, receive, send)
            finally:
                in_flight.dec()
        else:
            await self._logged(scope, receive, send)

    async def _logged(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            log.info("request", extra={"method": scope["method"], "path": redact(scope["path"]),
                                       "status": status,
                                       "ms": round((time.perf_counter() - start) * 1000, 1)})


def _before_calls(engine: Deps, data_dir: Path) -> None:
    """Before any call is taken: finish closes a crash cut off, then reconcile; and
    what the first login needs, so that it is no slower than the next."""
    # SPEC §19: a build a restart cut fails, its task closes, its leftovers go
    restarts.fail_cut(engine, contexts=data_dir / CONTEXTS)
    sweep(engine)
    accounts.prepare_logins()


def create_app(settings: Settings, deps: Deps | None = None,
               listen_host: str | None = None) -> FastAPI:
    """The app; `listen_host` is the address `rift serve` binds (a name it answers to)."""
    state = AppState(settings)
    security = security_settings(allowed_hosts(
        settings.allowed_hosts, settings.public_url, listen_host))
    mcp_lifespan: Any = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = deps if deps is not None else await anyio.to_thread.run_sync(
            build_deps, settings)
        await anyio.to_thread.run_sync(resume, engine, settings.sweep_interval_s)
        await anyio.to_thread.run_sync(_before_calls, engine, settings.data_dir)
        state.start(engine)
        proxy = None
        # What egress `open` refuses besides the host (SPEC §15): each host's deny sets.
        deny = EgressDeny(engine, settings.egress_deny, settings.database_url,
                          settings.public_url)
        await anyio.to_thread.run_sync(deny.start)
        if settings.egress_proxy_port and not settings.hypervisor_uri.startswith("test:"):
            proxy = EgressProxy(settings.egress_proxy_port, GuestsOnThisHost(engine),
                                denied=deny.denies)
            await anyio.to_thread.run_sync(proxy.start)
            state.metrics.watch_egress(proxy.refusals.snapshot)
        scheduler = start_scheduler(engine, settings.sweep_interval_s, settings.stats_interval_s)
        filler = PoolFiller(engine)
        filler.start()
        try:
            async with mcp_lifespan():
                yield
        finally:
            await anyio.to_thread.run_sync(filler.stop)
            if proxy is not None:
                await anyio.to_thread.run_sync(proxy.stop)
            await anyio.to_thread.run_sync(deny.stop)
            scheduler.shutdown(wait=True)
            if deps is None:
                await anyio.to_thread.run_sync(close_deps, engine)

    app = FastAPI(
        title="Rift", version="0.1.0", lifespan=lifespan,
        docs_url=None, redoc_url=None,  # their pages load scripts from a CDN: web/ serves /docs
        description="VMs lent to AI agents, grouped in tasks held under a lease. The handle "
        "(task_<id>.<secret>) travels in the Rift-Handle header; the API token in "
        "Authorization: Bearer rift_….")
    app.state.rift = state
    install_error_handlers(app)
    app.include_router(router)
    e2b.mount(app, state)  # the E2B door at /e2b (SPEC §16)
    install_web(app, state, HeldStream)  # the Boxes page: /, /login, /logout, /live, /static
    mcp_lifespan = mount_mcp(app, state, security)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        try:
            with state.deps.store.read() as tx:
                tx.users.count()
        except Exception as exc:
            log.warning("health check failed", extra={"error": str(exc)})
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", include_in_schema=False)
    def metrics(caller: Annotated[Caller, Depends(rest_caller)]) -> Response:
        # Series naming VMs and tasks (every user's) for operators' tokens only.
        return Response(state.metrics.render(operator=caller.operator),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(BodyGuard, max_body=e2b.body_limit(body_limit),
                       body_timeout_s=settings.body_timeout_s)
    # Who calls, before any body is read (the E2B door with its own credentials).
    app.add_middleware(TokenGate, state=state, doors={e2b_gate.PREFIX: e2b_gate.first_check})
    app.add_middleware(RebindingGuard, settings=security)
    _guest_ports(app, state)
    app.add_middleware(AccessLog, metrics=state.metrics)  # outermost: it logs the guard's refusals
    return app


def _guest_ports(app: FastAPI, state: AppState) -> None:
    """Before the guards: an exposure's request and body are its guest's to judge;
    before that, a sandbox's `<port>-<id>.<domain>` (SPEC §16) is not an exposure's
    secret."""
    app.add_middleware(ExposureProxy, state=state, preview_domain=state.settings.preview_domain)
    app.add_middleware(SandboxPorts, state=state)
