"""What an exposure's proxy forwards and answers itself (SPEC §13): the client's
headers as the guest gets them (never the hop-by-hop ones, nor what is Rift's:
`Authorization`, `Cookie`, `Rift-Handle`, `E2b-Traffic-Access-Token`), the sandbox a
guest's page gets under Rift's own origin, and the plain answers the proxy gives,
each with `Referrer-Policy: no-referrer` (the URL holds the exposure's secret).
"""

from __future__ import annotations

from starlette.types import Scope, Send

# Hop-by-hop headers (RFC 9110 §7.6.1) and what the proxy sets itself.
DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
                      b"proxy-authenticate", b"te", b"trailer", b"transfer-encoding",
                      b"upgrade", b"host", b"expect", b"content-length"})
SANDBOX = b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"
# What the client sends for Rift, never for the guest: its API token, its cookies
# (Rift's session; under a preview domain, a parent domain's), a task's handle, an
# E2B sandbox's traffic token (rift.e2b.ports).
PRIVATE = frozenset({b"authorization", b"cookie", b"rift-handle", b"e2b-traffic-access-token"})
# Every answer from an exposure: its URL (the secret in it) never leaves in a Referer.
NO_REFERRER = (b"referrer-policy", b"no-referrer")


def header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value)
    return b""


async def refuse(scope: Scope, send: Send, status: int, text: str) -> None:
    """A plain answer: to a WebSocket handshake as an HTTP response where the
    server can send one (ASGI's `websocket.http.response`), else a refusal."""
    if scope["type"] == "http":
        await plain(send, status, text)
    elif "websocket.http.response" in scope.get("extensions", {}):
        await plain(send, status, text, "websocket.http.response")
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": text[:120]})


async def plain(send: Send, status: int, text: str, kind: str = "http.response") -> None:
    body = (text + "\n").encode()
    await send({"type": f"{kind}.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), NO_REFERRER]})
    await send({"type": f"{kind}.body", "body": body})


def forwarded_headers(scope: Scope, port: int, own_origin: bool,
                      dropped: frozenset[bytes] = DROPPED) -> list[tuple[bytes, bytes]]:
    """The client's headers as the guest gets them: without the hop-by-hop ones and
    without what is Rift's (`Authorization`, `Cookie`, `Rift-Handle`), with
    `Host: localhost:<port>` and the `X-Forwarded-*` of the original request."""
    headers = [(k, v) for k, v in scope["headers"]
               if k.lower() not in dropped and k.lower() not in PRIVATE]
    scheme = str(scope.get("scheme") or "http")
    headers += [(b"host", f"localhost:{port}".encode()),
                (b"x-forwarded-host", header(scope, b"host")),
                (b"x-forwarded-proto", {"ws": "http", "wss": "https"}.get(scheme, scheme)
                 .encode())]
    client = scope.get("client")
    if client:
        headers.append((b"x-forwarded-for", str(client[0]).encode()))
    return headers
