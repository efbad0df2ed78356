"""What VMs use (SPEC §14's `stats`): the sampling over fake hypervisors and a
fake guest shell, on a real SQLite store; the VM view and /metrics that read it."""

from __future__ import annotations

from dataclasses import replace

from hypervisor.base import DomainStats
from hypervisor.fake import FakeHypervisor
from rift.api.metrics import Metrics
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain import usage
from rift.domain.clock import FakeClock
from rift.services.background.usage import sample_usage
from rift.services.context import Deps
from rift.services.lifecycle import pauses, tasks, vms
from tests.support.engine import ALICE
from tests.support.fake_guest import FakeFiles, fake_guests
from tests.support.vm_rows import give_ssh_address

PROC_NET_DEV = "\n".join([  # as a guest's kernel writes it (columns shortened)
    "Inter-|   Receive                            |  Transmit",
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets",
    "    lo:  999999 10 0 0 0 0 0 0   999999 10 0 0 0 0 0 0",
    "  eth0:  123456 100 0 0 0 0 0 0   65432 90 0 0 0 0 0 0",
]) + "\n"


def test_the_first_sample_has_no_cpu_share_and_the_next_one_does() -> None:
    first = usage.advance(None, usage.Sample(at=100.0, cpu_time_ns=10**9, memory_rss_kib=204800,
                                             disk_allocation_bytes=4096, net=(1, 2)), vcpus=2)
    now = usage.view(first)
    assert now is not None and now["cpu_pct"] is None
    assert (now["memory_used_mib"], now["disk_used_bytes"]) == (200, 4096)
    assert (now["net_rx_bytes"], now["net_tx_bytes"]) == (1, 2)
    # 10 s later, 5 s of CPU on 2 vCPUs: a quarter of them; the network kept
    second = usage.advance(first, usage.Sample(at=110.0, cpu_time_ns=6 * 10**9,
                                               memory_rss_kib=307200, disk_allocation_bytes=8192),
                           vcpus=2)
    now = usage.view(second)
    assert now is not None and now["cpu_pct"] == 25.0 and now["memory_used_mib"] == 300
    assert (now["net_rx_bytes"], now["net_tx_bytes"]) == (1, 2)
    assert now["at"] == "1970-01-01T00:01:50Z"
    assert usage.history(second) == [(100.0, None, 200), (110.0, 25.0, 300)]
    assert not usage.net_due(second, 150.0, 60) and usage.net_due(second, 160.0, 60)


def test_the_history_keeps_the_latest_samples_and_a_restart_counts_no_negative_cpu() -> None:
    text = None
    for i in range(usage.HISTORY + 5):
        text = usage.advance(text, usage.Sample(at=float(i), cpu_time_ns=i * 10**8,
                                                memory_rss_kib=1024, disk_allocation_bytes=None),
                             vcpus=1)
    kept = usage.history(text)
    assert len(kept) == usage.HISTORY and kept[-1][0] == usage.HISTORY + 4
    assert kept[-1][1] == 10.0
    restarted = usage.advance(text, usage.Sample(at=1000.0, cpu_time_ns=0, memory_rss_kib=1024,
                                                 disk_allocation_bytes=None), vcpus=1)
    view = usage.view(restarted)
    assert view is not None and view["cpu_pct"] is None


def test_net_counters_add_every_interface_but_loopback() -> None:
    assert usage.net_counters(PROC_NET_DEV) == (123456, 65432)
    assert usage.net_counters("Inter-|\n face |\n    lo: 1 2 3 4 5 6 7 8 9 10\n") is None
    assert usage.net_counters("garbage") is None


def test_running_vms_are_sampled_into_their_view_and_metrics_and_paused_ones_are_not(
        deps: Deps, local_hv: FakeHypervisor, clock: FakeClock) -> None:
    shell = FakeFiles(files={"/proc/net/dev": PROC_NET_DEV.encode()})
    deps = replace(deps, guests=fake_guests(files=shell))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    busy = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", vcpus=2)).vm
    parked = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    assert busy.stats is None  # nothing sampled yet
    with deps.store.write() as tx:  # a guest behind it (fake hosts have none)
        give_ssh_address(tx, busy.id)
    pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=parked.id))
    local_hv.usage[f"rift-{busy.id}"] = DomainStats(cpu_time_ns=10**9, memory_rss_kib=262144,
                                                    disk_allocation_bytes=1 << 20)
    assert sample_usage(deps, net_every_s=60) == 1
    clock.advance(10)
    local_hv.usage[f"rift-{busy.id}"] = DomainStats(cpu_time_ns=11 * 10**9,
                                                    memory_rss_kib=270336,
                                                    disk_allocation_bytes=2 << 20)
    shell.files["/proc/net/dev"] = b"not read again within a sweep interval"
    assert sample_usage(deps, net_every_s=60) == 1
    seen = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=busy.id)).vm.model_dump()["stats"]
    assert seen is not None
    assert seen["cpu_pct"] == 50.0 and seen["memory_used_mib"] == 264
    assert seen["disk_used_bytes"] == 2 << 20
    assert (seen["net_rx_bytes"], seen["net_tx_bytes"]) == (123456, 65432)
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=parked.id)).vm.stats is None

    metrics = Metrics()
    metrics.watch(deps)
    text = metrics.render(operator=True).decode()
    labels = f'host="local",task="{opened.task.id}",vm="{busy.id}"'
    assert f"rift_vm_cpu_percent{{{labels}}} 50.0" in text
    assert f"rift_vm_memory_used_mib{{{labels}}} 264.0" in text
    assert f"rift_vm_net_rx_bytes{{{labels}}} 123456.0" in text
    assert parked.id not in text
    # A token that is not an operator's reads aggregates only: no VM or task named.
    plain = metrics.render(operator=False).decode()
    assert "rift_running_vms " in plain
    assert busy.id not in plain and opened.task.id not in plain
    assert "rift_vm_cpu_percent" not in plain


def test_a_host_that_says_nothing_or_refuses_leaves_its_vms_as_they_were(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="tiny")).vm
    assert sample_usage(deps, net_every_s=60) == 0  # the host says nothing of it yet
    local_hv.usage[f"rift-{vm.id}"] = DomainStats(cpu_time_ns=10**9)
    local_hv.fail_next("stats", "connection reset")
    assert sample_usage(deps, net_every_s=60) == 0
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.stats is None
    assert sample_usage(deps, net_every_s=60) == 1  # no guest shell: the network unknown
    seen = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.model_dump()["stats"]
    assert seen is not None and seen["net_rx_bytes"] is None and seen["memory_used_mib"] is None


def test_a_guest_that_makes_up_a_huge_net_dev_gets_no_net_figures(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    lie = PROC_NET_DEV + "  eth9: " + "9" * 70_000 + "\n"
    shell = FakeFiles(files={"/proc/net/dev": lie.encode()})
    deps = replace(deps, guests=fake_guests(files=shell))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="tiny")).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    local_hv.usage[f"rift-{vm.id}"] = DomainStats(cpu_time_ns=10**9, memory_rss_kib=1024,
                                                  disk_allocation_bytes=1 << 20)
    assert sample_usage(deps, net_every_s=60) == 1
    seen = vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.model_dump()["stats"]
    assert seen["disk_used_bytes"] == 1 << 20
    assert seen["net_rx_bytes"] is None and seen["net_tx_bytes"] is None
