"""The Connect protocol (connectrpc.com/docs/protocol), as envd speaks it to the SDK:
its JSON codec only (the SDK's `ENVD_JSON_CODEC`; a binary-protobuf request is
answered `unimplemented`).

- unary calls: `Content-Type: application/json`, the message as the body; an error
  is a non-200 status with `{"code", "message"}`.
- server-streaming calls: `Content-Type: application/connect+json`; request and
  answer are envelopes (one flag byte, a 4-byte big-endian length, the message);
  the answer ends with an end-of-stream envelope (flag 2): `{}`, or `{"error": …}`.
"""

from __future__ import annotations

import json
import struct
from typing import Any

STREAM_JSON = "application/connect+json"
UNARY_JSON = "application/json"
END_STREAM = 0x02
COMPRESSED = 0x01
MAX_MESSAGE = 64 * 1024  # a request message (process starts, selectors): small

# Connect codes for HTTP statuses (the protocol's table, read the other way).
CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
         404: "not_found", 409: "failed_precondition", 413: "resource_exhausted",
         415: "unimplemented", 422: "invalid_argument", 429: "resource_exhausted",
         500: "internal", 501: "unimplemented", 502: "unavailable", 503: "unavailable",
         504: "deadline_exceeded"}
HTTP_OF = {"invalid_argument": 400, "already_exists": 409, "unauthenticated": 401,
           "permission_denied": 403,
           "not_found": 404, "failed_precondition": 412, "resource_exhausted": 429,
           "unimplemented": 501, "internal": 500, "unavailable": 503,
           "deadline_exceeded": 504, "canceled": 499, "unknown": 500}


class ConnectFault(Exception):
    """A call answered with a Connect error: its code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(fault: ConnectFault | None = None) -> bytes:
    return envelope({} if fault is None else {"error": fault.body()}, END_STREAM)


def _object(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConnectFault("invalid_argument", f"the message is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ConnectFault("invalid_argument", "the message must be a JSON object")
    return parsed


def stream_request(content_type: str, body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's request body."""
    if content_type.split(";", maxsplit=1)[0].strip().lower() != STREAM_JSON:
        raise ConnectFault("unimplemented", f"this envd speaks {STREAM_JSON} only, "
                           f"not {content_type[:80]!r}")
    if len(body) < 5:
        raise ConnectFault("invalid_argument", "the request is not a Connect envelope")
    flags, size = struct.unpack(">BI", body[:5])
    if flags & COMPRESSED:
        raise ConnectFault("unimplemented", "compressed messages are not accepted")
    if flags != 0 or size != len(body) - 5 or size > MAX_MESSAGE:
        raise ConnectFault("invalid_argument",
                           "the request must be exactly one Connect envelope of at most "
                           f"{MAX_MESSAGE} bytes")
    return _object(body[5:])


def unary_request(content_type: str, body: bytes) -> dict[str, Any]:
    if content_type.split(";", maxsplit=1)[0].strip().lower() != UNARY_JSON:
        raise ConnectFault("unimplemented", f"this envd speaks {UNARY_JSON} only, "
                           f"not {content_type[:80]!r}")
    if len(body) > MAX_MESSAGE:
        raise ConnectFault("resource_exhausted", f"a message is at most {MAX_MESSAGE} bytes")
    return _object(body or b"{}")


def timeout_s(header: str | None, default: int, most: int) -> int:
    """A `Connect-Timeout-Ms` header in whole seconds (at least 1, at most `most`)."""
    if header is None or not header.isdigit() or len(header) > 10:
        return default
    return max(1, min(most, -(-int(header) // 1000)))
