"""Who is calling: the name an MCP client declared, wherever its era keeps it.

- protocol `2026-07-28`: in every request's `_meta` (client info);
- the `initialize` era: once, in `initialize`. Rift runs the SDK stateless (any
  replica answers any request), so the door answers that handshake with an
  `Mcp-Session-Id` that carries the declared name (`r1.<nonce>.<name, base64url>`,
  nothing secret), which clients echo on every later request. Claiming another
  name this way is no more than declaring it: the label is for people to read,
  authorization comes from the token and the handle alone;
- else the User-Agent's product (`claude-code/1.0 (cli)` → `claude-code`), unless
  it names an HTTP library; else nothing, and the holder is `mcp:unknown`.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from starlette.requests import Request
from starlette.types import Message, Send

_NAME_MAX = 64
_SESSION_PREFIX = "r1"
# User-Agent products that name an HTTP library, not the agent using it.
_LIBRARIES = frozenset({
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
    """The product of a User-Agent (`claude-code/1.0 (cli)` → `claude-code`), unless it
    names an HTTP library."""
    first = (user_agent or "").split(" ", 1)[0].split("/", 1)[0]
    if not _PRODUCT_RE.fullmatch(first) or first.lower() in _LIBRARIES:
        return None
    return clean_name(first)


def client_name(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The name the MCP client declared, wherever this era keeps it."""
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
    """The client name an `initialize` request declares, if `message` is one."""
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    info = params.get("clientInfo") if isinstance(params, dict) else None
    return clean_name(info.get("name")) if isinstance(info, dict) else None


def with_session_id(send: Send, name: str) -> Send:
    """`send`, with a successful answer carrying an `Mcp-Session-Id` that names `name`."""
    session = session_id_for(name).encode("ascii")

    async def named_send(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 200:
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"mcp-session-id", session)]}
        await send(message)

    return named_send
