"""HTTP/1 request heads as the egress proxy reads them: the request line, the
headers (a line without a colon is a bad request) and `host:port` targets."""

from __future__ import annotations

from rift.proxy.refusals import Refused

# Request headers a proxy consumes (RFC 9110 §7.6.1): never sent upstream.
HOP_HEADERS = frozenset({b"connection", b"proxy-connection", b"keep-alive",
                         b"proxy-authorization", b"te", b"trailer", b"upgrade"})


def split_host_port(text: str, default_port: int) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or a bare host; ValueError when the port is no port."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    port = int(port_text) if port_text else default_port
    if not host or not 1 <= port <= 65535:
        raise ValueError(text)
    return host.lower().rstrip("."), port


def parse_head(head: bytes) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """A request head's line (split at its spaces) and its headers (names lowercased);
    Refused (`bad_request`) for a header line without a colon."""
    lines = head.split(b"\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon:
            raise Refused("bad_request", "a header line without a colon")
        headers.append((name.strip().lower(), value.strip()))
    return lines[0].split(b" "), headers


def host_of(value: bytes, default_port: int) -> tuple[str, int] | None:
    """A `Host` header's (host, port), None when it is none."""
    try:
        return split_host_port(value.decode("ascii"), default_port)
    except (ValueError, UnicodeDecodeError):
        return None


def hosts_in(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """Every `Host` header's value: a request must carry exactly one."""
    return [value for name, value in headers if name == b"host"]
