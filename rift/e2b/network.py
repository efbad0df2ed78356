"""A sandbox's network rules (E2B's `allow_internet_access` and `network.allowOut`,
`denyOut`) as Rift's egress (SPEC §13, §15). Pure: no I/O.

Rift's egress is `open` (the networks beyond the host, minus link-local, the
metadata addresses and Rift's own hosts), `none`, or an allowlist of names and
CIDRs reached over HTTP and HTTPS through Rift's proxy (failing closed on SNI and
`Host`). E2B's rules map onto it so that nothing is reachable that the rules
deny:

- no rules, or `allow_internet_access: true`: the default (`RIFT_DEFAULT_EGRESS`,
  `open` unless the operator says otherwise);
- `allow_internet_access: false`, or `denyOut` naming all traffic (`0.0.0.0/0`;
  `::/0` too): `none`, or, with `allowOut`, the allowlist of those (allowed entries
  take precedence, as in E2B);
- `denyOut` of some addresses only (a deny list): refused (400 naming what to send
  instead): Rift has no per-sandbox deny list, and answering `open` would reach
  what the caller denied;
- `allowOut` without a deny: everything is allowed anyway: the default.

`dnsServers` is accepted and has no effect (Rift's proxy resolves the names an
allowlist lets through). `rules` (header transforms) and `egressProxy` (SOCKS5)
are not served (501). `allowPublicTraffic`, `maskRequestHost` and `httpsPorts`
concern traffic in (the sandbox's ports), not out, and are left to that part.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from rift.domain.errors import InvalidArgument, RiftError

ALL_TRAFFIC = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
NOT_SERVED = {"rules": "header transforms of outbound requests",
              "egressProxy": "a SOCKS5 proxy for egress"}
_KNOWN = {"allowOut", "denyOut", "dnsServers", "allowPublicTraffic", "maskRequestHost",
          "httpsPorts", *NOT_SERVED}


class NotServed(RiftError):
    """An option the door does not serve: 501, as E2B answers what it does not serve."""

    code = "not_served"
    status = 501

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what} ({why}) is not served by Rift's E2B door",
                         "leave it out (README: Connect E2B code)", field=what)


def _entries(network: dict[str, Any], key: str) -> list[str]:
    value = network.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 64 or not all(
            isinstance(v, str) and 0 < len(v) <= 255 for v in value):
        raise InvalidArgument(f"network.{key}", "a list of at most 64 CIDRs, addresses or "
                              "names")
    return [v.strip() for v in value]


def _is_all(entry: str) -> bool:
    try:
        return ipaddress.ip_network(entry, strict=False) in ALL_TRAFFIC
    except ValueError:
        raise InvalidArgument("network.denyOut", f"{entry[:60]!r} is not a CIDR or an "
                              "address (E2B denies addresses only)") from None


def _allowed(entry: str, allow: list[str]) -> bool:
    """Whether a denied CIDR lies within an allowed one (allowed entries win)."""
    denied = ipaddress.ip_network(entry, strict=False)
    for listed in allow:
        try:
            net = ipaddress.ip_network(listed, strict=False)
        except ValueError:
            continue  # a name
        if net.version == denied.version and denied.subnet_of(net):  # type: ignore[arg-type]
            return True
    return False


def egress_of(body: dict[str, Any]) -> str | dict[str, list[str]] | None:
    """The egress (`rift_vm_new`'s) a create body's rules ask for; None: the default."""
    internet = body.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise InvalidArgument("allow_internet_access", "true or false")
    network = body.get("network")
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidArgument("network", "an object")
    unknown = sorted(set(network) - _KNOWN)
    if unknown:
        raise InvalidArgument("network", f"{unknown[0][:40]!r} is not an E2B network option")
    for key, why in NOT_SERVED.items():
        if network.get(key):
            raise NotServed(f"network.{key}", why)
    allow = _entries(network, "allowOut")
    denied = _entries(network, "denyOut")
    deny_all = internet is False or any(_is_all(entry) for entry in denied)
    if deny_all:
        return {"allow": allow} if allow else "none"
    if any(not _allowed(entry, allow) for entry in denied):
        raise InvalidArgument("network.denyOut", "Rift's egress is open, none or an "
                              "allowlist, with no deny list of its own: deny all traffic "
                              "(0.0.0.0/0) and name in allowOut what the sandbox may reach")
    return None
