"""**Who is calling** (`client_name`): the holder label is `mcp:` plus the name
the client declared. On 2026-07-28 it rides every request's `_meta`. In the
`initialize` era it comes once, in `initialize`, and Rift runs stateless (any
replica answers any request), so `Door` answers that handshake with an
`Mcp-Session-Id` that carries the name (`r1.<nonce>.<name, base64url>`,
nothing secret), which clients echo on every later request. Claiming another
name this way is no more than declaring it: the label is for people to read;
authorization is the token's and the handle's. Else the User-Agent's product
(`claude-code/1.0 (cli)` → `claude-code`) unless it names an HTTP library.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import ServerRequestContext
from starlette.requests import Request
from starlette.types import Message, Send

from rift.services.context import Caller

OPERATOR_SCOPE = "rift:operator"  # an operator's token (`rift token new USER --operator`)


_NAME_MAX = 64
_SESSION_PREFIX = "r1"
_LIBRARIES = frozenset({  # User-Agent products that name an HTTP library, not an agent
    "python-httpx", "python-httpx2", "httpx", "python-requests", "python-urllib", "aiohttp",
    "node", "node-fetch", "undici", "axios", "go-http-client", "okhttp", "java", "mozilla",
})
_PRODUCT_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def clean_name(raw: object) -> str | None:
    """A client's declared name, fit to show people: printable, at most 64 characters."""
    if not isinstance(raw, str):
        return None
    name = " ".join("".join(c if c.isprintable() else " " for c in raw).split())
    return name[:_NAME_MAX] or None


def session_id_for(name: str) -> str:
    encoded = base64.urlsafe_b64encode(name.encode("utf-8")).rstrip(b"=").decode("ascii")
    return f"{_SESSION_PREFIX}.{secrets.token_hex(8)}.{encoded}"


def name_in_session_id(session_id: str | None) -> str | None:
    parts = (session_id or "").split(".")
    if len(parts) != 3 or parts[0] != _SESSION_PREFIX:
        return None
    try:
        raw = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        return clean_name(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def name_in_user_agent(user_agent: str | None) -> str | None:
    first = (user_agent or "").split(" ", 1)[0].split("/", 1)[0]
    if not _PRODUCT_RE.fullmatch(first) or first.lower() in _LIBRARIES:
        return None
    return clean_name(first)


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """The user of the request's token, and the holder label of its client."""
    user = ctx.request.scope.get("user") if isinstance(ctx.request, Request) else None
    token = user.access_token if isinstance(user, AuthenticatedUser) else get_access_token()
    if token is None or token.subject is None:
        raise RuntimeError("an MCP call reached a tool without an authenticated user")
    return Caller(token.subject, f"mcp:{client_name(ctx) or 'unknown'}",
                  operator=OPERATOR_SCOPE in token.scopes)


def client_name(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The name the MCP client declared, wherever its era keeps it."""
    params = ctx.session.client_params  # the handshake's, or a 2026 envelope's
    if params is not None:
        return clean_name(params.client_info.name)
    info = (ctx.meta or {}).get(types.CLIENT_INFO_META_KEY)
    if isinstance(info, dict) and (name := clean_name(info.get("name"))):
        return name
    request = ctx.request
    if not isinstance(request, Request):
        return None
    return (name_in_session_id(request.headers.get("mcp-session-id"))
            or name_in_user_agent(request.headers.get("user-agent")))


def initialize_name(message: object) -> str | None:
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    info = params.get("clientInfo") if isinstance(params, dict) else None
    return clean_name(info.get("name")) if isinstance(info, dict) else None


def with_session_id(send: Send, name: str) -> Send:
    session = session_id_for(name).encode("ascii")

    async def named_send(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 200:
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"mcp-session-id", session)]}
        await send(message)

    return named_send


