"""Bearer tokens for REST: `Authorization: Bearer rift_…` names the user."""

from __future__ import annotations

import anyio
from fastapi import Request

from rift.api.gate import CALLER_KEY
from rift.api.state import AppState
from rift.domain.errors import Unauthorized
from rift.services.access import accounts
from rift.services.context import Caller


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def rest_caller(request: Request) -> Caller:
    """A FastAPI dependency: the caller `TokenGate` found before the body was read
    (else the token is looked up here, in a worker thread)."""
    found = request.scope.get("state", {}).get(CALLER_KEY)
    if isinstance(found, Caller):
        return found
    state: AppState = request.app.state.rift
    token = bearer(request)
    if token is None:
        raise Unauthorized()
    _record, caller = await anyio.to_thread.run_sync(accounts.authenticate, state.deps, token)
    return caller
