"""Cookies, the same-origin check and the headers every HTML answer carries."""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

SESSION_COOKIE = "rift_session"
LOGIN_COOKIE = "rift_login_form"
LOGIN_FORM_TTL_S = 3600

# Nothing from other sites, no inline script or style: even a string that
# escaped escaping could not run.
HTML_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def html(content: str, status_code: int = 200,
         headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(content, status_code=status_code, headers={**HTML_HEADERS,
                                                                    **(headers or {})})


def secure(request: Request) -> bool:
    """Served over HTTPS (uvicorn takes X-Forwarded-Proto from trusted proxies)."""
    return request.url.scheme == "https"


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int,
               path: str = "/") -> None:
    response.set_cookie(name, value, max_age=max_age, expires=max_age, path=path,
                        secure=secure(request), httponly=True, samesite="strict")


def clear_cookie(response: Response, request: Request, name: str, path: str = "/") -> None:
    response.delete_cookie(name, path=path, secure=secure(request), httponly=True,
                           samesite="strict")


def same_origin(request: Request) -> bool:
    """A form post from this site: its ``Origin`` (or, without one, its
    ``Referer``) names the host the request was sent to. A post with neither
    passes here and rests on the form token alone."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None:
        return True
    host = request.headers.get("host", "")
    return bool(host) and source != "null" and urlsplit(source).netloc == host


def wants_html(request: Request) -> bool:
    """Browsers get HTML error pages; the REST API keeps its JSON."""
    if request.url.path.startswith(("/api/", "/mcp")):
        return False
    accept = request.headers.get("accept", "")
    return "text/html" in accept or "application/json" not in accept
