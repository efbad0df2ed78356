"""The Boxes page (SPEC §7): `GET /` after a login, live through `GET /live`.

Routes parse, call one service, render. Plain `def` routes run in worker
threads (the store blocks); the live stream is async and sends its store reads
to worker threads. The only forms are login and logout; both carry a form
token and pass the same-origin check.
"""

from __future__ import annotations

import inspect
from functools import partial
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException

from rift.domain.errors import TooManyWaiting
from rift.services.access import sessions
from rift.services.read import boxes
from web import apidocs, live, render
from web.security import (
    LOGIN_COOKIE,
    LOGIN_FORM_TTL_S,
    SESSION_COOKIE,
    clear_cookie,
    html,
    same_origin,
    set_cookie,
    wants_html,
)
from web.state import HeldStream, Page, PageState, page_of

STATIC = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {"boxes.css": "text/css; charset=utf-8",
                "boxes.js": "text/javascript; charset=utf-8"}
FormText = Annotated[str, Form()]

router = APIRouter(include_in_schema=False)


def _state(request: Request) -> PageState:
    return page_of(request).state


def _signed_in(request: Request) -> tuple[str, str] | None:
    """(user, session id) of a live session cookie; an API token logs no one in."""
    session_id = request.cookies.get(SESSION_COOKIE)
    user = sessions.session_user(_state(request).deps, session_id)
    return None if user is None or session_id is None else (user, session_id)


def _connect(request: Request) -> dict[str, str]:
    return {"mcp_url": str(request.base_url) + "mcp"}


def _see_other(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303, headers={"Cache-Control": "no-store"})


@router.get("/")
def boxes_page(request: Request) -> Response:
    signed_in = _signed_in(request)
    if signed_in is None:
        return _see_other("/login")
    user, session_id = signed_in
    state = _state(request)
    page = boxes.read_page(state.deps, user)
    return html(request, render.boxes_page(page, state.deps.clock.now(), _connect(request),
                                  sessions.session_form_token(session_id),
                                  state.settings.task_idle_s))


def _login_page(request: Request, message: str = "", user: str = "",
                status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    token = sessions.form_token()
    response = html(request, render.render("login.html", form_token=token, message=message,
                                  user=user[:64]), status_code, headers)
    set_cookie(response, request, LOGIN_COOKIE, token, LOGIN_FORM_TTL_S)
    return response


@router.get("/login")
def login_form(request: Request) -> Response:
    if _signed_in(request) is not None:
        return _see_other("/")
    return _login_page(request)


@router.post("/login")
async def login(request: Request, user: FormText = "", password: FormText = "",
                csrf: FormText = "") -> Response:
    """Sign-ins run on threads of their own (`PageState.login_threads`): a burst of
    them queues there, never taking the threads other calls are served from."""
    state = _state(request)
    if not same_origin(request) or not sessions.same_token(csrf,
                                                           request.cookies.get(LOGIN_COOKIE)):
        return _login_page(request, "The sign-in form had expired. Try again.", user, 403)
    address = request.client.host if request.client else "unknown"
    try:
        made = await anyio.to_thread.run_sync(partial(
            sessions.log_in, state.deps, sessions.LoginAttempt(user, password, address),
            state.settings.session_ttl_s, state.login_checks), limiter=state.login_threads)
    except sessions.LoginBusy:
        return _login_page(request, "Too many sign-ins at once. Try again in a second.", user,
                           429, {"Retry-After": "1"})
    except sessions.LoginThrottled as exc:
        return _login_page(request, f"Too many failed sign-ins. Try again in "
                           f"{exc.retry_after_s} s.", user, 429,
                           {"Retry-After": str(exc.retry_after_s)})
    except sessions.LoginRefused:
        return _login_page(request, "Wrong user name or password.", user, 401)
    response = _see_other("/")
    set_cookie(response, request, SESSION_COOKIE, made.session_id, state.settings.session_ttl_s)
    clear_cookie(response, request, LOGIN_COOKIE)
    return response


@router.post("/logout")
def logout(request: Request, csrf: FormText = "") -> Response:
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        expected = sessions.session_form_token(session_id)
        if not same_origin(request) or not sessions.same_token(csrf, expected):
            return html(request, render.render("error.html", status=403, heading="Not logged out",
                                      message="That form was out of date. Reload the page "
                                      "and log out again."), 403)
        sessions.log_out(_state(request).deps, session_id)
    response = _see_other("/login")
    clear_cookie(response, request, SESSION_COOKIE)
    return response


@router.get("/live")
def live_stream(request: Request, v: str | None = None) -> Response:
    """One Server-Sent Events stream per open page (see `web/live.py`)."""
    signed_in = _signed_in(request)
    if signed_in is None:
        return Response("sign in first\n", status_code=401, media_type="text/plain")
    user, session_id = signed_in
    state = _state(request)
    connect = _connect(request)

    def fragment(page: boxes.BoxesPage) -> str:
        return render.live_region(page, state.deps.clock.now(), connect)

    since = request.headers.get("last-event-id") or v
    try:
        give = state.waiting.take(user)  # an open page waits: one of its user's places
    except TooManyWaiting as exc:
        return Response(f"{exc.message}\n", status_code=429, media_type="text/plain",
                        headers={"Retry-After": "5"})
    events = live.stream(request, live.Feed(state.deps, state.settings.live_poll_s, fragment),
                         user, session_id, since)
    return page_of(request).held_stream(
        events, give, media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@router.get("/docs")
def api_docs(request: Request) -> Response:
    """The REST API's reference, rendered here: no script, nothing from other sites."""
    document = request.app.openapi()
    info = document.get("info", {})
    found = apidocs.schemas(document)
    return html(request, render.render(
        "docs.html", title=info.get("title", "Rift"), version=info.get("version", ""),
        description=info.get("description", ""), operations=apidocs.operations(document),
        schemas=found, known={s.name for s in found}, linked=apidocs.linked))


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC_TYPES:
        raise HTTPException(404, "Not Found")
    return Response((STATIC / name).read_bytes(), media_type=STATIC_TYPES[name],
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


def install(app: FastAPI, state: PageState, held_stream: HeldStream) -> None:
    """Add the page's routes, and an HTML 404 page for browsers (the REST API
    and other clients keep the JSON answer of `rift.api.errors`). The app hands
    over its state and how it answers a stream that holds a waiting place."""
    app.state.boxes_page = Page(state, held_stream)
    app.include_router(router)
    json_handler = app.exception_handlers[HTTPException]

    async def not_found(request: Request, exc: Exception) -> Response:
        if wants_html(request):
            return html(request, render.render("error.html", status=404, heading="Not found",
                                      message="There is no page here."), 404)
        answer = json_handler(request, exc)
        return await answer if inspect.isawaitable(answer) else answer

    app.add_exception_handler(404, not_found)
