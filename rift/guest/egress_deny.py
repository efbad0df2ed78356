"""What egress `open` refuses besides the host itself (SPEC §15): link-local, the
cloud metadata addresses, Rift's own hosts (every hypervisor's address and the
control plane's), its database and the operator's `RIFT_EGRESS_DENY`.

It is enforced by each host's firewall (hypervisor/guest_isolation.nft): the
table's sets `deny_v4` and `deny_v6` refuse new connections of QEMU's group
`rift-guests` there. The table holds the fixed entries from the start; this
module fills in the rest, per host, with what it computed here: at `rift
serve`'s start, then whenever what a host should refuse changes (a host added
or removed) and every REAPPLY_S anyway (a host rebooted loads the file's fixed
entries only). On this machine it runs `nft` itself (as root); on a host
elsewhere, `nft` over the host's SSH (as root, or through `sudo -n` for another
user: the ansible role lets its `rift` user run `nft -f -` and nothing else;
a host where neither works keeps the file's fixed entries, and a warning says
so). The egress proxy refuses the same addresses to allowlisted guests
(`denied`). The same script fills the table's fleet sets: who may reach the
host's live migration ports (every host's address and this machine's), and its
peer sets: the other hypervisors, whose migration ports the host's QEMU streams
a guest with a disk to (over migration TLS) though the deny sets name them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from hypervisor.base import elsewhere
from rift.domain.model import Host
from rift.guest.links import HostLinkError, HostLinks, ssh_target
from rift.services.context import Deps

log = logging.getLogger("rift.egress")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Link-local (a cloud host's metadata service and its credentials live there) and
# the metadata addresses outside it (Alibaba's, AWS's IPv6 one); also in the table.
FIXED = ("169.254.0.0/16", "100.100.100.200/32", "fe80::/10", "fd00:ec2::254/128")
REFRESH_S = 30.0  # how often what each host should refuse is computed again
REAPPLY_S = 60.0  # and put there even when it did not change (a host restarted)
TABLE = "inet rift_guests"


def parse_networks(text: str) -> list[Network]:
    """`RIFT_EGRESS_DENY`'s comma-separated CIDRs (a bare address is its /32 or /128)."""
    return [ipaddress.ip_network(entry, strict=False)
            for entry in (e.strip() for e in text.split(",")) if entry]


def addresses_of(host: str | None) -> list[Address]:
    """The addresses a host name or literal stands for; none for no host, a socket
    path or a name that does not resolve."""
    if not host or host.startswith("/"):
        return []
    with contextlib.suppress(ValueError):
        return [ipaddress.ip_address(host.strip("[]"))]
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return list(dict.fromkeys(ipaddress.ip_address(str(f[4][0]).split("%")[0])
                              for f in found))


def database_host(database_url: str | None) -> str | None:
    """The host a network database URL names (None for SQLite or a Unix socket)."""
    if not database_url or database_url.startswith("sqlite"):
        return None
    parsed = urlsplit(database_url)
    if parsed.hostname:
        return parsed.hostname
    for part in parsed.query.split("&"):  # postgresql://u@/db?host=10.0.0.5
        key, _, value = part.partition("=")
        if key == "host" and value and not value.startswith("/"):
            return value
    return None


def own_addresses() -> list[Address]:
    """This machine's addresses (`ip -j addr`): the control plane's, when it is not
    also the host (where the table's `fib daddr type local` refuses them already)."""
    ip = shutil.which("ip")
    if ip is None:
        return []
    try:
        done = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True,  # noqa: S603 (fixed arguments)
                              timeout=5, check=False)
        listed = json.loads(done.stdout or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []
    found: list[Address] = []
    for link in listed:
        for info in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                address = ipaddress.ip_address(info["local"])
                if not (address.is_loopback or address.is_link_local):
                    found.append(address)
    return found


def collapsed(networks: Iterable[Network]) -> tuple[list[ipaddress.IPv4Network],
                                                    list[ipaddress.IPv6Network]]:
    """The networks by family, overlaps merged (an nft interval set takes no overlap)."""
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    return list(ipaddress.collapse_addresses(v4)), list(ipaddress.collapse_addresses(v6))


def nft_script(networks: Iterable[Network], fleet: Iterable[Network] = (),
               peers: Iterable[Network] = ()) -> str:
    """What `nft -f -` takes to make the table's deny sets exactly `networks` (and the
    fixed entries), its fleet sets (who may reach the migration ports) exactly
    `fleet` and its peer sets (whose migration ports its QEMU may reach) exactly
    `peers`, in one transaction: never a moment with a set empty. The peer sets are
    made first where the table, loaded from an older file, has none."""
    v4, v6 = collapsed([*(ipaddress.ip_network(n) for n in FIXED), *networks])
    f4, f6 = collapsed(fleet)
    p4, p6 = collapsed(peers)
    lines = [f"flush set {TABLE} {name}"
             for name in ("deny_v4", "deny_v6", "fleet_v4", "fleet_v6")]
    for name, nets in (("deny_v4", v4), ("deny_v6", v6), ("fleet_v4", f4), ("fleet_v6", f6)):
        if nets:
            lines.append(f"add element {TABLE} {name} {{ {', '.join(map(str, nets))} }}")
    for name, family, nets in (("peers_v4", "ipv4_addr", p4), ("peers_v6", "ipv6_addr", p6)):
        lines += [f"add set {TABLE} {name} {{ type {family}; flags interval; }}",
                  f"flush set {TABLE} {name}"]
        if nets:
            lines.append(f"add element {TABLE} {name} {{ {', '.join(map(str, nets))} }}")
    return "\n".join(lines) + "\n"


class EgressDeny:
    """Keeps every host's deny sets filled (see the module's notes)."""

    def __init__(self, deps: Deps, extra: str = "", database_url: str | None = None,
                 public_url: str | None = None, links: HostLinks | None = None) -> None:
        self.deps = deps
        self.extra = parse_networks(extra)
        self.database_url = database_url
        self.public_url = public_url
        self.links = links or HostLinks()
        self._applied: dict[str, tuple[tuple[str, ...], float]] = {}  # host -> (nets, when)
        self._common: list[Network] = [ipaddress.ip_network(n) for n in FIXED]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def fleet(self, hosts: Iterable[Host]) -> list[Network]:
        """Rift's own machines: every host elsewhere and this one (the control plane)."""
        return [*(ipaddress.ip_network(a) for a in own_addresses()), *self.peers(hosts)]

    def peers(self, hosts: Iterable[Host]) -> list[Network]:
        """The hosts elsewhere (where a VM may move to), not the control plane."""
        addresses: list[Address] = []
        for host in hosts:
            target = ssh_target(host.uri)
            if target is not None:
                addresses += addresses_of(target.host)
        return [ipaddress.ip_network(a) for a in addresses]

    def common(self, hosts: Iterable[Host], fleet: list[Network] | None = None
               ) -> list[Network]:
        """What every host refuses: the operator's CIDRs, the database, the control
        plane (its URL's host, this machine's addresses) and every host elsewhere."""
        addresses = [*addresses_of(database_host(self.database_url)),
                     *addresses_of(urlsplit(self.public_url or "").hostname)]
        return [*self.extra, *(ipaddress.ip_network(a) for a in addresses),
                *(fleet if fleet is not None else self.fleet(hosts))]

    def refresh(self) -> dict[str, str]:
        """Compute and put in place each host's sets where they changed or are old;
        per host, what happened (`applied`, `kept`, `skipped: …` or the failure)."""
        with self.deps.store.read() as tx:
            hosts = tx.hosts.all()
        fleet, peers = self.fleet(hosts), self.peers(hosts)
        common = self.common(hosts, fleet)
        self._common = [ipaddress.ip_network(n) for n in FIXED] + common
        done = {}
        for host in hosts:
            try:
                done[host.name] = self._refresh_host(host, common, fleet, peers)
            except (OSError, HostLinkError, subprocess.SubprocessError) as exc:
                done[host.name] = f"failed: {exc}"
                log.warning("the egress deny set could not be put on a host",
                            extra={"host": host.name, "error": str(exc)})
        return done

    def _refresh_host(self, host: Host, common: list[Network], fleet: list[Network],
                      peers: list[Network]) -> str:
        if host.uri.startswith("test:"):
            return "skipped: not a real host"
        target = ssh_target(host.uri)
        networks = list(common)
        if target is not None:  # the control plane as this host sees it
            sock = self.links.transport(target).sock
            if isinstance(sock, socket.socket):
                with contextlib.suppress(OSError, ValueError):
                    networks.append(ipaddress.ip_network(sock.getsockname()[0]))
        elif elsewhere(host.uri):
            return "skipped: a remote URI without SSH"
        elif os.geteuid() != 0:
            return "skipped: not root (scripts/libvirt.sh's table keeps its fixed entries)"
        script = nft_script(networks, fleet, peers)
        key = tuple(sorted(script.splitlines()))
        before = self._applied.get(host.name)
        if before is not None and before[0] == key and time.monotonic() - before[1] < REAPPLY_S:
            return "kept"
        if target is not None:  # root there, or a user sudo lets run `nft -f -` (ansible)
            command = "nft -f -" if target.user == "root" else "sudo -n nft -f -"
            self.links.run_bytes(target, command, script.encode(), timeout_s=30)
        else:
            nft = shutil.which("nft") or "/usr/sbin/nft"
            ran = subprocess.run([nft, "-f", "-"], input=script, capture_output=True,  # noqa: S603 (fixed arguments)
                                 text=True, timeout=30, check=False)
            if ran.returncode != 0:
                raise OSError(f"nft: {ran.stderr.strip()[-300:]}")
        self._applied[host.name] = (key, time.monotonic())
        log.info("egress deny set put on a host", extra={"host": host.name,
                                                         "networks": len(key) - 4})
        return "applied"

    def start(self) -> None:
        """Refresh now, then every REFRESH_S in a thread of its own."""
        self.refresh()

        def loop() -> None:
            while not self._stop.wait(REFRESH_S):
                try:
                    self.refresh()
                except Exception:  # the next round tries again
                    log.exception("refreshing the egress deny sets failed")

        self._thread = threading.Thread(target=loop, name="rift-egress-deny", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.links.close()

    def denies(self, address: Address) -> bool:
        """Whether an allowlisted guest's proxy refuses `address` too (`denied`): what
        the last refresh computed (no lookup per connection)."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self._common if net.version == address.version)
