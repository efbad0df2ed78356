"""The egress proxy's upstream side: where an allowed host is (never this host
itself, nor what egress `open` refuses too), the connection to it (by address: no
second lookup that could answer otherwise), and the bytes copied both ways."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable

from rift.domain import egress
from rift.proxy.refusals import Refused, Unreachable

CONNECT_TIMEOUT_S = 10.0
CHUNK = 64 * 1024


def is_host_local(address: egress.Address) -> bool:
    """Whether `address` is this host itself (or no host at all): never a destination."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if (address.is_loopback or address.is_link_local or address.is_unspecified
            or address.is_multicast):
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))  # only an address of this host's binds
        except OSError:
            return False
    return True


async def addresses(host: str, port: int, is_local: Callable[[egress.Address], bool],
                    denied: Callable[[egress.Address], bool]) -> list[egress.Address]:
    """Where `host` is, without this host's own addresses (`is_local`) and those egress
    `open` refuses too (`denied`); Refused when that leaves none."""
    literal = egress.address_of(host)
    if literal is not None:
        candidates = [literal]
    else:
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise Refused("unresolved", f"{host} does not resolve") from None
        candidates = list(dict.fromkeys(ipaddress.ip_address(f[4][0]) for f in found))
    usable = [a for a in candidates if not is_local(a)]
    if not usable:
        raise Refused("host_local", f"{host} is this host: no guest reaches its services")
    usable = [a for a in usable if not denied(a)]
    if not usable:
        raise Refused("denied", f"{host} is where no guest goes (a metadata or link-local "
                      "address, Rift's own hosts or database, or RIFT_EGRESS_DENY)")
    return usable


async def connect(found: list[egress.Address], port: int
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of `found` that answers; Unreachable when none does."""
    why = "no address"
    for address in found:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(str(address), port, limit=CHUNK)
        except TimeoutError:
            why = f"{address} port {port}: no answer within {CONNECT_TIMEOUT_S:.0f} s"
        except OSError as exc:
            why = f"{address} port {port}: {exc.strerror or exc}"
    raise Unreachable(why)


async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until EOF with one chunk in flight (bounded memory), then half-close."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        sink.close()
