"""One error tree, rendered once: RiftError → `{"error": {...}}` with its status;
validation errors (FastAPI's of a body, query or path, or a tool's input model)
become `invalid_argument` naming the field, through the contract's `refusal_of`,
the same mapping the MCP door uses."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from rift.api.gate import BodyRefused
from rift.contract.base import refusal_of
from rift.domain.errors import InvalidArgument, RateLimited, RiftError, Unauthorized

log = logging.getLogger("rift.api")


def error_response(err: RiftError) -> JSONResponse:
    headers: dict[str, str] = {}
    if isinstance(err, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="rift"'
    if isinstance(err, RateLimited):
        headers["Retry-After"] = str(err.details.get("retry_after_s", 60))
    return JSONResponse({"error": err.to_dict()}, status_code=err.status, headers=headers)


def validation_refusal(exc: RequestValidationError | ValidationError) -> InvalidArgument:
    errors = list(exc.errors())
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":  # its loc ends with a character position
        where = tuple(first.get("loc", ()))[-1:]
        ctx = first.get("ctx")
        why = str(ctx.get("error", "malformed")) if isinstance(ctx, dict) else "malformed"
        at = f" at character {where[0]}" if where and isinstance(where[0], int) else ""
        return InvalidArgument("body", f"is not valid JSON: {why}{at}")
    return refusal_of(errors, located=isinstance(exc, RequestValidationError))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RiftError)
    async def rift_error(_request: Request, exc: RiftError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_refusal(exc))

    @app.exception_handler(ValidationError)
    async def invalid_input(_request: Request, exc: ValidationError) -> JSONResponse:
        return error_response(validation_refusal(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc, BodyRefused):
            return JSONResponse({"error": exc.error}, status_code=exc.status_code)
        if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8, say)
            answer = error_response(InvalidArgument(
                "body", f"could not be read ({exc.detail}): send a JSON object in UTF-8"))
            answer.status_code = 400
            return answer
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"error": {"code": code, "message": str(exc.detail),
                                       "hint": "GET /openapi.json lists the routes"}},
                            status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", extra={"path": request.url.path})
        return JSONResponse({"error": {"code": "internal", "message": "an internal error; "
                                       "it was logged", "hint": "try again; rift doctor"}},
                            status_code=500)
