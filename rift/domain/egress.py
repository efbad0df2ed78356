"""A VM's egress (SPEC §13): `open`, `none`, or an allowlist of names and CIDRs.

Kept as one string: `open`, `none`, or the allowlist's canonical JSON
(`{"allow": [...]}`, entries lowercased, deduplicated and sorted), so the store's
`vms.egress` column holds all three and two equal lists compare equal. Pure: no
sockets here (the proxy that enforces an allowlist is rift.proxy).

Entries: a name (`pypi.org`), a wildcard (`*.github.com`: every name below
github.com, not github.com itself), or a CIDR (`10.0.0.0/8`; a bare address is
its /32 or /128). A name matches names only and a CIDR matches addresses only:
a name that is not listed is refused even when it resolves into a listed CIDR.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

OPEN, NONE = "open", "none"
MAX_ENTRIES = 64
MAX_NAME = 253
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class BadEntry(ValueError):
    """An allowlist entry that is neither a name nor a CIDR, or a list out of range."""


@dataclass(frozen=True)
class Allowlist:
    names: frozenset[str]  # exact names
    suffixes: tuple[str, ...]  # of `*.` entries, with their leading dot
    networks: tuple[Network, ...]

    def allows_name(self, name: str) -> bool:
        name = name.lower().rstrip(".")
        return name in self.names or any(name.endswith(s) for s in self.suffixes)

    def allows_address(self, address: Address) -> bool:
        return any(address in net for net in self.networks if net.version == address.version)

    def allows(self, host: str) -> bool:
        """Whether `host` (a name or an address literal, as a client named it) is listed."""
        literal = address_of(host)
        return self.allows_address(literal) if literal is not None else self.allows_name(host)


def address_of(host: str) -> Address | None:
    """The address `host` spells (IPv6 with or without brackets), or None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def canonical_entry(entry: object) -> str:
    """The entry as it is kept: a CIDR in its network form, a name in lowercase."""
    if not isinstance(entry, str) or not entry.strip():
        raise BadEntry("an entry must be a name or a CIDR, not empty")
    text = entry.strip().lower()
    if "/" in text or address_of(text) is not None:
        try:
            return str(ipaddress.ip_network(text.strip("[]"), strict=False))
        except ValueError:
            raise BadEntry(f"{entry!r} is neither a name nor a CIDR") from None
    wildcard = text.startswith("*.")
    name = text[2:] if wildcard else text
    name = name.rstrip(".")
    labels = name.split(".")
    if (not name or len(name) > MAX_NAME or not all(_LABEL.fullmatch(label) for label in labels)
            or (wildcard and len(labels) < 2)):
        raise BadEntry(f"{entry!r} is neither a name (such as pypi.org or *.github.com) "
                       "nor a CIDR (such as 10.0.0.0/8)")
    return f"*.{name}" if wildcard else name


def canonical(value: object) -> str:
    """`open`, `none`, or an allowlist's canonical JSON; BadEntry when it is none of them.
    Takes `{"allow": [...]}` as a dict or as its JSON text (what the store keeps)."""
    if value in (OPEN, NONE):
        return str(value)
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            raise BadEntry("not JSON") from None
    if not isinstance(value, dict) or set(value) != {"allow"}:
        raise BadEntry('open, none, or {"allow": [names or CIDRs]}')
    entries = value["allow"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_ENTRIES:
        raise BadEntry(f"allow must list 1 to {MAX_ENTRIES} names or CIDRs")
    kept = sorted({canonical_entry(e) for e in entries})
    return json.dumps({"allow": kept}, separators=(",", ":"))


def entries(egress: str) -> list[str] | None:
    """The allowlist's entries, or None for `open` and `none`."""
    if egress in (OPEN, NONE):
        return None
    return list(json.loads(egress)["allow"])


def view(egress: str) -> str | dict[str, list[str]]:
    """The VM view's `egress`: `open`, `none`, or `{"allow": [...]}`."""
    listed = entries(egress)
    return egress if listed is None else {"allow": listed}


def allowlist(egress: str) -> Allowlist | None:
    """The allowlist of an egress, or None when it is `open` or `none`."""
    listed = entries(egress)
    return None if listed is None else compile_entries(listed)


def compile_entries(listed: Iterable[str]) -> Allowlist:
    names, suffixes, networks = set(), [], []
    for entry in listed:
        if address_of(entry.split("/")[0]) is not None:
            networks.append(ipaddress.ip_network(entry, strict=False))
        elif entry.startswith("*."):
            suffixes.append(entry[1:])
        else:
            names.add(entry)
    return Allowlist(frozenset(names), tuple(suffixes), tuple(networks))


def proxied(egress: str) -> bool:
    """Whether the guest reaches the networks only through Rift's egress proxy."""
    return egress not in (OPEN, NONE)


def proxy_environment(proxy_url: str) -> str:
    """The shell prefix that names the egress proxy to a command in the guest: curl,
    pip, git, apt and wget all read these."""
    names = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
    sets = " ".join(f"{name}={proxy_url}" for name in names)
    return f"export {sets} no_proxy=localhost,127.0.0.1 NO_PROXY=localhost,127.0.0.1; "
