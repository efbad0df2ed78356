"""Cookies, the same-origin check and the headers every HTML answer carries."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from rift.services.access import sessions
from web.state import page_of

SESSION_COOKIE = sessions.SESSION_COOKIE  # the engine's sessions name it (the gate reads it)
LOGIN_COOKIE = "rift_login_form"
LOGIN_FORM_TTL_S = 3600
COOKIE_PATHS = {LOGIN_COOKIE: "/login"}  # the sign-in form's goes to the sign-in only; else "/"

HTML_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# The page's own files, by path: `'self'` would also allow a script an exposure's
# guest serves under `/x/` on this origin.
SCRIPTS = ("/static/boxes.js",)
STYLES = ("/static/boxes.css",)
LIVE = "/live"
_ORIGIN_RE = re.compile(r"https?://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


def content_security_policy(request: Request) -> str:
    """Nothing from other sites, no inline script or style, and of this origin only
    the page's own script, style sheet and live stream: even a string that escaped
    escaping could not run, nor load a script from an exposure on this origin."""
    origins = [origin for origin in (f"{request.url.scheme}://{request.url.netloc}",
                                     _public_origin(request))
               if origin and _ORIGIN_RE.fullmatch(origin)]  # a plain origin, or none
    if not origins:
        return "default-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

    def named(paths: tuple[str, ...]) -> str:
        return " ".join(dict.fromkeys(origin + path for origin in origins for path in paths))

    return (f"default-src 'none'; script-src {named(SCRIPTS)}; style-src {named(STYLES)}; "
            f"connect-src {named((LIVE,))}; img-src 'self'; form-action 'self'; "
            "base-uri 'none'; frame-ancestors 'none'")


def _public_origin(request: Request) -> str:
    """`RIFT_PUBLIC_URL`'s origin: what a browser sees behind a proxy that does not
    pass the original `Host` on."""
    public_url = page_of(request).state.settings.public_url
    if not public_url:
        return ""
    parts = urlsplit(public_url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


def html(request: Request, content: str, status_code: int = 200,
         headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(content, status_code=status_code, headers={
        **HTML_HEADERS, "Content-Security-Policy": content_security_policy(request),
        **(headers or {})})


def secure(request: Request) -> bool:
    """Served over HTTPS (uvicorn takes X-Forwarded-Proto from trusted proxies), or
    published at an https `RIFT_PUBLIC_URL` (a TLS proxy in front that does not say so)."""
    public_url = page_of(request).state.settings.public_url or ""
    return request.url.scheme == "https" or public_url.lower().startswith("https://")


def set_cookie(response: Response, request: Request, name: str, value: str,
               max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, expires=max_age,
                        path=COOKIE_PATHS.get(name, "/"),
                        secure=secure(request), httponly=True, samesite="strict")


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(name, path=COOKIE_PATHS.get(name, "/"), secure=secure(request),
                           httponly=True, samesite="strict")


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
