"""Sampling what running VMs use (SPEC §14's `stats`): every `RIFT_STATS_INTERVAL_S`,
one libvirt call per host (virConnectGetAllDomainStats: CPU time, the QEMU
process's resident memory, its disk's allocation) and, at most once a sweep
interval, the guest's own network counters (/proc/net/dev: QEMU's user network
has no host-side interface that libvirt could count). Each VM's figures go
into its row (rift.domain.usage), which the VM view, /metrics and the Boxes
page read. Every replica may sample: the last write wins, and each is whole.
"""

from __future__ import annotations

from hypervisor.base import DomainStats, HypervisorError
from rift.domain import usage
from rift.domain.errors import RiftError
from rift.domain.model import Vm
from rift.services.context import Deps
from rift.services.disk_budget import sample_host_disk


def sample_usage(deps: Deps, net_every_s: float) -> int:
    """Sample every running VM of every reachable host; answers how many were sampled."""
    with deps.store.read() as tx:
        hosts = [h for h in tx.hosts.all() if h.unreachable_since is None]
    sampled = 0
    for host in hosts:
        sample_host_disk(deps, host.name, deps.hosts.hypervisor(host.uri).disk)
        with deps.store.read() as tx:
            running = [vm for vm in tx.vms.live_on_host(host.name)
                       if vm.status == "running" and vm.change is None]
        if not running:
            continue
        try:
            found = deps.hosts.hypervisor(host.uri).stats()
        except HypervisorError as exc:
            deps.log.info("usage not sampled", extra={"host": host.name, "error": str(exc)})
            continue
        for vm in running:
            got = found.get(vm.domain_name)
            if got is None or got == DomainStats():  # the host says nothing (the test driver)
                continue
            now = deps.clock.now().timestamp()
            net = _net(deps, vm) if usage.net_due(vm.stats, now, net_every_s) else None
            text = usage.advance(vm.stats, usage.Sample(
                at=now, cpu_time_ns=got.cpu_time_ns, memory_rss_kib=got.memory_rss_kib,
                disk_allocation_bytes=got.disk_allocation_bytes, net=net), vm.vcpus)
            with deps.store.write() as tx:
                if tx.vms.update(vm.id, ("running",), stats=text):
                    sampled += 1
    if sampled:  # the Boxes pages draw the new figures
        with deps.store.write() as tx:
            tx.meta.swap(usage.MARK_KEY, tx.meta.get(usage.MARK_KEY),
                         str(deps.clock.now().timestamp()))
    return sampled


def _net(deps: Deps, vm: Vm) -> tuple[int, int] | None:
    """The guest's (received, sent) bytes; None when it cannot say now."""
    if deps.guests is None or vm.ssh_port is None:
        return None
    try:
        data, _truncated = deps.guests.read_file(vm, "/proc/net/dev")
    except (RiftError, OSError):
        return None
    return usage.net_counters(data.decode("utf-8", "replace"))
