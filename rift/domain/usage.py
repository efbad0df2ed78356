"""What a VM uses (SPEC §14's `stats`), kept in the store as one JSON text per VM.

The text holds the latest figures (the VM view's `stats`), what the next sample
needs to turn CPU time into a percentage (the CPU time and when it was read),
when the guest's network counters were last read, and a short history of CPU
and memory that the Boxes page draws. Pure: the sampling is
rift.services.background.usage's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

HISTORY = 60  # samples kept for the Boxes page's charts
# The meta key each round of sampling sets: part of the Boxes page's change mark.
MARK_KEY = "usage_sampled"


@dataclass(frozen=True)
class Sample:
    """One reading of a running VM: libvirt's, and the guest's network counters
    when they were read this time (None: keep the last ones)."""

    at: float  # seconds since the epoch
    cpu_time_ns: int | None
    memory_rss_kib: int | None
    disk_allocation_bytes: int | None
    net: tuple[int, int] | None = None  # (received, sent) bytes


def advance(previous: str | None, sample: Sample, vcpus: int) -> str:
    """The stats text after `sample`, given the text before it (None: the first)."""
    before: dict[str, Any] = json.loads(previous) if previous else {}
    last = before.get("now", {})
    cpu_pct = None
    prior_ns, prior_at = before.get("cpu_ns"), before.get("sampled")
    if (sample.cpu_time_ns is not None and prior_ns is not None and prior_at is not None
            and sample.at > prior_at and sample.cpu_time_ns >= prior_ns):
        spent = (sample.cpu_time_ns - prior_ns) / 1e9
        cpu_pct = round(min(100.0, 100.0 * spent / ((sample.at - prior_at) * max(1, vcpus))), 1)
    rx, tx = sample.net if sample.net is not None else (
        last.get("net_rx_bytes"), last.get("net_tx_bytes"))
    now = {
        "cpu_pct": cpu_pct,
        "memory_used_mib": (round(sample.memory_rss_kib / 1024)
                            if sample.memory_rss_kib is not None else None),
        "disk_used_bytes": sample.disk_allocation_bytes,
        "net_rx_bytes": rx,
        "net_tx_bytes": tx,
        "at": datetime.fromtimestamp(sample.at, UTC).isoformat().replace("+00:00", "Z"),
    }
    history = [*before.get("history", []), [round(sample.at, 1), cpu_pct,
                                            now["memory_used_mib"]]][-HISTORY:]
    kept = {"now": now, "cpu_ns": sample.cpu_time_ns, "sampled": sample.at,
            "net_at": sample.at if sample.net is not None else before.get("net_at"),
            "history": history}
    return json.dumps(kept, separators=(",", ":"))


def net_due(stats: str | None, now: float, every_s: float) -> bool:
    """Whether the guest's network counters are to be read again (read every `every_s`)."""
    if not stats:
        return True
    net_at = json.loads(stats).get("net_at")
    return net_at is None or now - net_at >= every_s


def view(stats: str | None) -> dict[str, Any] | None:
    """The VM view's `stats`: `{cpu_pct, memory_used_mib, disk_used_bytes,
    net_rx_bytes, net_tx_bytes, at}`, or None before the first sample."""
    if not stats:
        return None
    now: dict[str, Any] = json.loads(stats).get("now")
    return now


def history(stats: str | None) -> list[tuple[float, float | None, int | None]]:
    """(when, CPU %, memory MiB) of the latest samples, oldest first."""
    if not stats:
        return []
    return [(at, cpu, mem) for at, cpu, mem in json.loads(stats).get("history", [])]


def net_counters(proc_net_dev: str) -> tuple[int, int] | None:
    """(received, sent) bytes of every interface but loopback, from /proc/net/dev."""
    rx = tx = 0
    seen = False
    for line in proc_net_dev.splitlines()[2:]:
        name, colon, rest = line.partition(":")
        fields = rest.split()
        if not colon or name.strip() == "lo" or len(fields) < 9:
            continue
        try:
            rx, tx = rx + int(fields[0]), tx + int(fields[8])
        except ValueError:
            return None
        seen = True
    return (rx, tx) if seen else None
