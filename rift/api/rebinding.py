"""No DNS rebinding: every door answers only requests addressed to Rift itself.

A page on another site can point its own name at 127.0.0.1 and have a browser
send requests to a Rift listening there; those requests carry the other site's
name in `Host` (and `Origin`). Rift serves only the names it is reached by:
`RIFT_ALLOWED_HOSTS` when set, else the loopback names, the address `rift serve`
listens on (on a wildcard address, this machine's host names) and the host of
`RIFT_PUBLIC_URL`, each on any port. An `Origin`, when a request carries one,
must be `http://` or `https://` one of those.

The rule is the MCP SDK's own transport security (`TransportSecuritySettings`):
the MCP door's session managers get it, and `RebindingGuard` applies the same
check in front of every route (REST, the Boxes page, `/metrics`), so all doors
refuse alike: 421 for a foreign `Host`, 403 for a foreign `Origin`. `/healthz`
(no token, no data) stays open to load balancers that probe by address.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from rift.api.guard import error_body

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "")  # noqa: S104 (names of the wildcard, not a bind)
OPEN_PATHS = ("/healthz",)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def allowed_hosts(configured: str | None, public_url: str | None,
                  listen_host: str | None) -> list[str]:
    """`Host` values Rift answers (`name` or `name:port`; `name:*` is any port);
    `["*"]` turns the check off."""
    if configured:
        return [h.strip() for h in configured.split(",") if h.strip()]
    names = list(LOOPBACK)
    if listen_host is not None:
        if listen_host in WILDCARDS:
            fqdn = socket.getfqdn()
            names += [socket.gethostname(), fqdn]
        else:
            names.append(_bracketed(listen_host))
    hosts: list[str] = []
    for name in dict.fromkeys(n.lower() for n in names if n):
        hosts += [name, f"{name}:*"]
    if public_url:
        netloc = urlsplit(public_url).netloc.rpartition("@")[2].lower()
        if netloc and netloc not in hosts:
            hosts.append(netloc)
    return hosts


def security_settings(hosts: list[str]) -> TransportSecuritySettings:
    if hosts == ["*"]:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=hosts, allowed_origins=origins)


VOUCHED = "rift_host_vouched"  # in a scope's state: a middleware before this one named the host


def vouched(scope: Scope) -> bool:
    """Whether a middleware in front (rift.e2b.ports' envd host names) already took
    the request's `Host` as one of Rift's own: no exposure, no rebinding."""
    return bool(scope.get("state", {}).get(VOUCHED))


class RebindingGuard:
    """The SDK's Host and Origin check in front of every route but `/healthz`."""

    def __init__(self, app: ASGIApp, settings: TransportSecuritySettings) -> None:
        self.app = app
        self.check = TransportSecurityMiddleware(settings)
        self.enabled = settings.enable_dns_rebinding_protection

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.enabled or scope["type"] != "http" or scope["path"] in OPEN_PATHS \
                or vouched(scope):
            await self.app(scope, receive, send)
            return
        refused = await self.check.validate_request(Request(scope), is_post=False)
        if refused is None:
            await self.app(scope, receive, send)
            return
        what = "Host" if refused.status_code == 421 else "Origin"
        message = (f"{what}: this Rift does not answer requests for another site's name "
                   "(DNS rebinding protection)")
        hint = ("call Rift by the name it is configured for; the operator adds names with "
                "RIFT_ALLOWED_HOSTS or RIFT_PUBLIC_URL")
        body = error_body({"code": "invalid_argument", "message": message, "hint": hint,
                           "field": what}, mcp=scope["path"] == "/mcp")
        await send({"type": "http.response.start", "status": refused.status_code,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
