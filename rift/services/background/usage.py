"""Sampling what running VMs use (SPEC §14's `stats`): every `RIFT_STATS_INTERVAL_S`,
one libvirt call per host (virConnectGetAllDomainStats: CPU time, the QEMU
process's resident memory, its disk's allocation) and, at most once a sweep
interval, the guest's own network counters (/proc/net/dev: QEMU's user network
has no host-side interface that libvirt could count). Each VM's figures go
into its row (rift.domain.usage), which the VM view, /metrics and the Boxes
page read; each host's volumes have their used bytes read too (volume_usage).
Every replica may sample: the last write wins, and each is whole.
"""

from __future__ import annotations

from hypervisor.base import DomainStats, HypervisorError
from rift.domain import usage
from rift.domain.errors import RiftError
from rift.domain.model import Vm
from rift.services.background.bounded import per_vm
from rift.services.background.volume_usage import sample_volumes
from rift.services.context import Deps
from rift.services.lifecycle.disk_budget import sample_host_disk

NET_DEV_MAX = 64 * 1024  # /proc/net/dev of a guest with a few hundred interfaces
NET_DEV_TIMEOUT_S = 5.0  # a guest that does not answer this soon is left for the next sample


def sample_usage(deps: Deps, net_every_s: float) -> int:
    """Sample every running VM of every reachable host; answers how many were sampled."""
    with deps.store.read() as tx:
        hosts = [h for h in tx.hosts.all() if h.unreachable_since is None]
    sampled = 0
    for host in hosts:
        sample_host_disk(deps, host.name, deps.hosts.hypervisor(host.uri).disk)
        sample_volumes(deps, host)
        with deps.store.read() as tx:
            running = [vm for vm in tx.fleet.live_on_host(host.name)
                       if vm.status == "running" and vm.change is None]
        if not running:
            continue
        try:
            found = deps.hosts.hypervisor(host.uri).stats()
        except HypervisorError as exc:
            deps.log.info("usage not sampled", extra={"host": host.name, "error": str(exc)})
            continue
        running = [vm for vm in running if found.get(vm.domain_name) not in (None, DomainStats())]
        # Guests' own counters, read a VM at a time in a few threads (each bounded):
        # a guest that stalls holds up no other VM's figures.
        due = {vm.id: [vm] for vm in running
               if usage.net_due(vm.stats, deps.clock.now().timestamp(), net_every_s)}
        nets = dict(per_vm(due, lambda vm, _left: (vm.id, _net(deps, vm))))
        for vm in running:
            got = found[vm.domain_name]
            now = deps.clock.now().timestamp()
            net = nets.get(vm.id)
            text = usage.advance(vm.stats, usage.Sample(
                at=now, cpu_time_ns=got.cpu_time_ns, memory_rss_kib=got.memory_rss_kib,
                disk_allocation_bytes=got.disk_allocation_bytes, net=net), vm.vcpus)
            with deps.store.write() as tx:
                if tx.vms.record_stats(vm.id, text):
                    sampled += 1
    if sampled:  # the Boxes pages draw the new figures
        with deps.store.write() as tx:
            tx.meta.swap(usage.MARK_KEY, tx.meta.get(usage.MARK_KEY),
                         str(deps.clock.now().timestamp()))
    return sampled


def _net(deps: Deps, vm: Vm) -> tuple[int, int] | None:
    """The guest's (received, sent) bytes; None when it cannot say now."""
    if vm.ssh_port is None:
        return None
    try:
        data, truncated = deps.guests.files.read_file(vm, "/proc/net/dev", limit=NET_DEV_MAX,
                                                      timeout_s=NET_DEV_TIMEOUT_S)
    except (RiftError, OSError):
        return None
    if truncated:
        return None  # no real /proc/net/dev is that long: a guest making it up
    return usage.net_counters(data.decode("utf-8", "replace"))
