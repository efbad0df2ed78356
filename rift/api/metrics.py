"""Prometheus metrics, one registry per app (tests build many apps in one process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rift.domain.model import StartKind
from rift.services.context import Deps


class StoreGauges(Collector):
    """Open tasks, running VMs and pooled VMs, read from the store when scraped, so
    every replica reports the same truth. Aggregates only: no VM, task or user named."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def collect(self) -> list[GaugeMetricFamily]:
        from rift.services.lifecycle.pools import pool_counts
        from rift.services.read.queries import counts

        open_tasks, running_vms = counts(self.deps)
        pooled = GaugeMetricFamily(
            "rift_pool_vms", "Pooled VMs by image and state (starting, ready, saving, saved).",
            labels=["image", "state"])
        for (image, state), count in sorted(pool_counts(self.deps).items()):
            pooled.add_metric([image, state], count)
        return [
            GaugeMetricFamily("rift_open_tasks", "Tasks open now.", value=open_tasks),
            GaugeMetricFamily("rift_running_vms", "VMs running now.", value=running_vms),
            pooled,
        ]


class VmUsage(Collector):
    """Each running VM's latest `stats` (SPEC §14), labelled by VM, task and host:
    series that name every user's VMs and tasks, served to operators' tokens only."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def collect(self) -> list[GaugeMetricFamily]:
        from rift.domain import usage

        labels = ["vm", "task", "host"]
        families = {
            "cpu_pct": GaugeMetricFamily(
                "rift_vm_cpu_percent", "A running VM's CPU over the last sample interval, "
                "% of its vCPUs.", labels=labels),
            "memory_used_mib": GaugeMetricFamily(
                "rift_vm_memory_used_mib", "A running VM's QEMU process's resident memory.",
                labels=labels),
            "disk_used_bytes": GaugeMetricFamily(
                "rift_vm_disk_used_bytes", "What a running VM's own disk holds on its host.",
                labels=labels),
            "net_rx_bytes": GaugeMetricFamily(
                "rift_vm_net_rx_bytes", "Bytes a running VM's guest has received.",
                labels=labels),
            "net_tx_bytes": GaugeMetricFamily(
                "rift_vm_net_tx_bytes", "Bytes a running VM's guest has sent.", labels=labels),
        }
        with self.deps.store.read() as tx:
            running = [vm for host in tx.hosts.all() for vm in tx.fleet.live_on_host(host.name)
                       if vm.status == "running"]
        for vm in running:
            now = usage.view(vm.stats) or {}
            for key, family in families.items():
                if now.get(key) is not None:
                    family.add_metric([vm.id, vm.task_id, vm.host], float(now[key]))
        return list(families.values())


class EgressRefusals(Collector):
    """Refused egress by reason: the egress proxy's refusals (not_listed, sni_mismatch,
    host_mismatch, host_local, unresolved, unknown_vm, bad_request) and, where this
    process can read them, the host firewall's packets (connect, dns, host_service)."""

    def __init__(self, proxied: Callable[[], dict[str, int]]) -> None:
        self.proxied = proxied

    def collect(self) -> list[CounterMetricFamily]:
        from rift.proxy.firewall import firewall_refusals

        family = CounterMetricFamily(
            "rift_egress_refused", "Egress refused, by reason: the egress proxy's "
            "requests, and the packets the host's guest firewall refused.", labels=["reason"])
        for reason, count in sorted({**self.proxied(), **firewall_refusals()}.items()):
            family.add_metric([reason], count)
        return [family]


DOORS = ("mcp", "rest", "live", "other")


def door_of(path: str) -> str:
    """The door a request came through: `/mcp`, REST, the Boxes page's live stream."""
    if path == "/mcp":
        return "mcp"
    if path.startswith("/api/"):
        return "rest"
    if path.startswith("/x/"):
        return "exposure"
    return "live" if path == "/live" else "other"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()  # aggregates: served to any token
        self.per_vm = CollectorRegistry()  # series naming VMs and tasks: operators only
        self.in_flight = Gauge(
            "rift_http_requests_in_flight", "HTTP requests being served now, by door (mcp, "
            "rest, live: the Boxes pages' open streams, other).", ["door"],
            registry=self.registry)
        for door in DOORS:
            self.in_flight.labels(door)
        self.tool_calls = Counter(
            "rift_tool_calls", "Tool and REST calls by tool and outcome code (ok or a refusal).",
            ["door", "tool", "outcome"], registry=self.registry)
        self.vm_start_seconds = Histogram(
            "rift_vm_start_seconds", "Seconds from rift_vm_new to a running VM, by how it "
            "started (boot: a cold boot; pool, restore, fork).", ["kind"],
            buckets=(0.01, 0.1, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120), registry=self.registry)
        for kind in get_args(StartKind):
            self.vm_start_seconds.labels(kind)
        self.up = Gauge("rift_up", "1 while this control plane serves.", registry=self.registry)
        self.up.set(1)

    def watch(self, deps: Deps) -> None:
        self.registry.register(StoreGauges(deps))
        self.per_vm.register(VmUsage(deps))
        deps.observers.vm_start_seconds.append(
            lambda kind, seconds: self.vm_start_seconds.labels(kind).observe(seconds))

    def watch_egress(self, proxied: Callable[[], dict[str, int]]) -> None:
        self.registry.register(EgressRefusals(proxied))

    def record(self, door: str, tool: str, outcome: str) -> None:
        self.tool_calls.labels(door, tool, outcome).inc()

    def render(self, operator: bool) -> bytes:
        """The exposition text: aggregates for any token, and the per-VM and per-task
        series (every user's VM and task ids) for an operator's only."""
        text = generate_latest(self.registry)
        return text + generate_latest(self.per_vm) if operator else text
