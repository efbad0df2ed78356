"""What a CONNECT tunnel must open with (SPEC §15: fail closed), before anything
goes upstream: a whole TLS ClientHello (every record of it, at most HELLO_LIMIT
bytes within HELLO_TIMEOUT_S) whose server name is the CONNECT host when that is a
name, and a listed name or none when it is a listed address; or a plain HTTP/1
request head with exactly one `Host`, naming the CONNECT host (or, to a listed
address, a listed host). Anything else closes the tunnel."""

from __future__ import annotations

import asyncio

from rift.domain import egress
from rift.proxy.heads import host_of, hosts_in, parse_head
from rift.proxy.hello import (
    HELLO_LIMIT,
    TLS_RECORD_LIMIT,
    BadHello,
    hello_message,
    hello_server_name,
    hello_whole,
)
from rift.proxy.refusals import Refused

HELLO_TIMEOUT_S = 10.0


async def tunnel_opening(reader: asyncio.StreamReader, host: str,
                         rules: egress.Allowlist) -> bytes:
    """What the client sends first in a tunnel to `host`, when it is a whole ClientHello
    or a plain request head the list allows (see the module's notes); Refused else."""
    first = b""
    try:
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            first = await reader.readexactly(1)
            if first == b"\x16":
                records = first + await reader.readexactly(4)
                while True:
                    length = int.from_bytes(records[-2:], "big")
                    if records[-5] != 0x16 or not 0 < length <= TLS_RECORD_LIMIT:
                        raise BadHello("not a TLS handshake record")
                    if len(records) + length > HELLO_LIMIT:
                        raise BadHello(f"a ClientHello of more than {HELLO_LIMIT} bytes")
                    records += await reader.readexactly(length)
                    if hello_whole(records):
                        break
                    records += await reader.readexactly(5)
                check_name(hello_server_name(hello_message(records)), host, rules, tls=True)
                return records
            head = first + await reader.readuntil(b"\r\n\r\n")
    except BadHello as bad:
        raise Refused("bad_hello", f"the tunnel to {host} did not open with one whole "
                      f"ClientHello: {bad}") from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        # cut short, too long or too slow: a ClientHello (bad_hello) or anything else
        raise Refused("bad_hello" if first == b"\x16" else "bad_request",
                      f"the tunnel to {host} did not open with a whole ClientHello or "
                      f"request head within {HELLO_TIMEOUT_S:.0f} s") from None
    try:
        request, headers = parse_head(head)
    except Refused:
        request, headers = [], []
    if len(request) != 3 or not request[2].startswith(b"HTTP/1."):
        raise Refused("bad_request", f"the tunnel to {host} opened with neither a TLS "
                      "ClientHello nor an HTTP request")
    hosts = hosts_in(headers)
    if len(hosts) != 1:
        raise Refused("host_mismatch", f"a request with {len(hosts)} Host headers, not one")
    named = host_of(hosts[0], 80)
    check_name(named[0] if named else "", host, rules, tls=False)
    return head


def check_name(said: str | None, host: str, rules: egress.Allowlist, tls: bool) -> None:
    """Refused unless the name a tunnel's first bytes ask for (a ClientHello's SNI,
    None for none; a request's Host) is the CONNECT's `host`, or, when that is an
    address, none (TLS only) or one the list allows."""
    if egress.address_of(host) is None:
        right = said == host
    else:
        right = (said is None and tls) or (bool(said) and rules.allows(str(said)))
    if not right:
        raise Refused("sni_mismatch", f"the tunnel to {host} asked for {said or 'no name'}")
