"""What the host's guest firewall refused (hypervisor/guest_isolation.nft's named
counters), beside the egress proxy's own refusals on /metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

FIREWALL_COUNTERS = {"refused": "host_service", "denied": "egress_deny",
                     "proxied_connect": "connect", "proxied_dns": "dns"}
_FIREWALL_CACHE_S = 2.0
_firewall_seen: dict[str, tuple[float, dict[str, int]]] = {}


def firewall_refusals() -> dict[str, int]:
    """Packets this host's guest firewall refused, by reason: `host_service` (a guest
    at its host's own addresses), `egress_deny` (an `open` guest at the deny sets:
    link-local, metadata, Rift's hosts and database, RIFT_EGRESS_DENY), `connect` and
    `dns` (a proxied guest around its proxy). Empty when the table cannot be read
    (not root, no nft, not loaded)."""
    at, seen = _firewall_seen.get("", (0.0, {}))
    if time.monotonic() - at < _FIREWALL_CACHE_S:
        return seen
    nft = shutil.which("nft")
    try:
        if nft is None:
            raise OSError("no nft")
        done = subprocess.run([nft, "-j", "list", "counters", "table", "inet", "rift_guests"],  # noqa: S603 (fixed arguments)
                              capture_output=True, text=True, timeout=5, check=False)
        listed = json.loads(done.stdout) if done.returncode == 0 else {"nftables": []}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        listed = {"nftables": []}
    seen = {}
    for item in listed.get("nftables", []):
        counter = item.get("counter") if isinstance(item, dict) else None
        if isinstance(counter, dict) and counter.get("name") in FIREWALL_COUNTERS:
            seen[FIREWALL_COUNTERS[counter["name"]]] = int(counter.get("packets", 0))
    _firewall_seen[""] = (time.monotonic(), seen)
    return seen
