"""Kinds with no guest to reach: libvirt's test driver, and a real host on a
control plane wired without a guest runtime."""

from __future__ import annotations

from collections.abc import Callable

from hypervisor.base import DomainSpec, HypervisorError
from rift.domain.errors import HypervisorFailed
from rift.domain.model import StartKind, Vm
from rift.services.lifecycle.guest_kinds.base import NO_RUNTIME, NotReady, Verdict, VmFiles
from rift.services.ports import HostFiles


class TestDriverGuest:
    """No guest behind the domain: running at once, no SSH address."""

    label = "test driver"
    start_kind: StartKind = "boot"

    def __init__(self, files: VmFiles) -> None:
        self.files = files

    def check(self) -> None:
        return None  # every image the catalog knows is accepted

    def ssh_port(self, free_port: Callable[[], int]) -> int | None:
        return None

    def plan(self, vm: Vm) -> DomainSpec:
        return DomainSpec(name=vm.domain_name, task_id=vm.task_id, vm_id=vm.id,
                          vcpus=vm.vcpus, memory_mib=vm.memory_mib, image=vm.image,
                          domain_type="test")

    def wait_ready(self, vm: Vm) -> None:
        return None

    def clean_up(self, vm_id: str) -> None:
        # It makes no files; any a VM id names (a host whose URI changed) go anyway.
        self.files.remove(vm_id)

    def receive(self, vm: Vm, host_files: HostFiles) -> None:
        return None  # no guest, no files: the domain alone moves

    def accelerator(self, verdict: Verdict) -> str:
        return "test driver: no guests, no accelerator needed"

    def missing_tools(self) -> str | None:
        return None


class NoGuests:
    """A real host, but this control plane was wired without a guest runtime."""

    label = "no guest runtime"
    start_kind: StartKind = "boot"

    def check(self) -> None:
        return None  # nothing to look at: the start says what is missing

    def ssh_port(self, free_port: Callable[[], int]) -> int | None:
        return free_port()

    def plan(self, vm: Vm) -> DomainSpec:
        raise HypervisorFailed(NO_RUNTIME, host=vm.host)

    def wait_ready(self, vm: Vm) -> None:
        raise NotReady(NO_RUNTIME)

    def clean_up(self, vm_id: str) -> None:
        return None

    def receive(self, vm: Vm, host_files: HostFiles) -> None:
        raise HypervisorError("migrate", NO_RUNTIME)

    def accelerator(self, verdict: Verdict) -> str:
        return NO_RUNTIME

    def missing_tools(self) -> str | None:
        return NO_RUNTIME
