"""A pytest plugin for a child pytest (tests/support/tls.py): names under the
domain in RIFT_TEST_RESOLVE (`<domain>=<port>`) resolve to 127.0.0.1 at that
port, whatever port their URL says (`https://8001-<id>.<domain>` is port 443),
for clients on Python's sockets (httpx's default transport)."""

from __future__ import annotations

import os
import socket
from typing import Any

_real = socket.getaddrinfo


def _install() -> None:
    spec = os.environ.get("RIFT_TEST_RESOLVE", "")
    domain, _eq, port = spec.partition("=")
    if not domain or not port.isdigit():
        return

    def getaddrinfo(host: Any, service: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith("." + domain):
            return _real("127.0.0.1", int(port), *args, **kwargs)
        return _real(host, service, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


_install()
