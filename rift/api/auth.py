"""Bearer tokens for REST: `Authorization: Bearer rift_…` names the user."""

from __future__ import annotations

from fastapi import Request

from rift.api.state import AppState
from rift.domain.errors import Unauthorized
from rift.services import accounts
from rift.services.context import Caller


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def rest_caller(request: Request) -> Caller:
    """A FastAPI dependency (plain `def`: FastAPI runs it in a worker thread)."""
    state: AppState = request.app.state.rift
    token = bearer(request)
    if token is None:
        raise Unauthorized()
    _record, caller = accounts.authenticate(state.deps, token)
    return caller
