"""Which VM a connection to the egress proxy comes from, read off the host, not
taken from the guest: the kernel's socket table (/proc/net/tcp) gives the socket at
the other end of the connection, and the QEMU process holding it names its domain
(`-name guest=rift-<vm id>`). The engine says what that domain's VM may reach
(rift.services.read.egress); a connection no running proxied VM owns is refused."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

from rift.services.context import Deps
from rift.services.read.egress import GuestEgress, egress_rules_for


def _hex_endpoint(port: int) -> str:
    return f"0100007F:{port:04X}"  # 127.0.0.1 as /proc/net/tcp spells it


def socket_inode(client_port: int, server_port: int, table: Path = Path("/proc/net/tcp")
                 ) -> str | None:
    """The inode of the socket 127.0.0.1:client_port connected to 127.0.0.1:server_port."""
    local, remote = _hex_endpoint(client_port), _hex_endpoint(server_port)
    with contextlib.suppress(OSError):
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                return fields[9]
    return None


def domain_holding(inode: str, proc: Path = Path("/proc")) -> str | None:
    """The libvirt domain name of the QEMU process that holds socket `inode`."""
    target = f"socket:[{inode}]"
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "comm").read_text().startswith("qemu-system"):
                continue
            fds = list((entry / "fd").iterdir())
            if not any(_readlink(fd) == target for fd in fds):
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # the process ended meanwhile
        for flag, value in itertools.pairwise(args):
            if flag == b"-name":
                for part in value.decode("utf-8", "replace").split(","):
                    if part.startswith("guest="):
                        return part[len("guest="):]
                return value.decode("utf-8", "replace").split(",")[0]
    return None


def _readlink(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


class GuestsOnThisHost:
    """The proxied guest a connection to the proxy comes from, as this host's socket
    table and processes tell, with its egress rules as the engine answers them."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def __call__(self, client_port: int, proxy_port: int) -> GuestEgress | None:
        inode = socket_inode(client_port, proxy_port)
        domain = domain_holding(inode) if inode is not None else None
        return None if domain is None else egress_rules_for(self.deps, domain)
