"""What every kind of guest answers to (`GuestKind`), and each VM's own files."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from hypervisor.base import DomainSpec
from hypervisor.disks import remove_vm_disks, vm_disks, vm_ids_with_disks
from rift.domain.errors import GuestUnreachable
from rift.domain.model import StartKind, Vm
from rift.services.absent import NO_RUNTIME, NO_SHELL
from rift.services.context import Deps, GuestRuntime, Runtime
from rift.services.ports import GuestExecs, GuestFiles, HostFiles

__all__ = ["NO_RUNTIME", "NO_SHELL", "GuestKind", "NotReady", "Verdict", "VmFiles", "mac_of",
           "reach", "real_runtime", "serial_log", "vm_files"]

P = TypeVar("P", GuestFiles, GuestExecs)

# How `rift doctor` learns which accelerator a host's guests get, and why.
Verdict = Callable[[str], tuple[str, str]]


class NotReady(Exception):
    """The guest did not answer within its boot wait; the text is the VM's error."""


class GuestKind(Protocol):
    """How VMs of one image start on one host, are waited for, reached and put away."""

    label: str  # what `rift doctor` shows beside the image: `test driver`, `kernel`, `qcow2`
    start_kind: StartKind  # what its VMs' `start.kind` is when they do not come from a pool

    def check(self) -> None:
        """ImageError unless the image can start on this host (built, registered)."""
        ...

    def ssh_port(self, free_port: Callable[[], int]) -> int | None:
        """The host loopback port forwarded to the guest's SSH (`free_port()` picks
        one), or None when no guest will answer there."""
        ...

    def plan(self, vm: Vm) -> DomainSpec:
        """Make the VM's own files and answer the domain that starts it.
        Raises ImageError or HypervisorFailed (its files are then the caller's to
        clean up)."""
        ...

    def wait_ready(self, vm: Vm) -> None:
        """Return once the guest of the started domain answers; NotReady after the
        boot wait."""
        ...

    def clean_up(self, vm_id: str) -> None:
        """Remove the VM's own files (serial log, overlay, seed); absent is fine."""
        ...

    def receive(self, vm: Vm, host_files: HostFiles) -> None:
        """Put on this kind's host what `vm`, moving here live, reads from its host's
        disk (the migration brings its memory and its disk's blocks); HypervisorError
        (op "migrate") when such VMs do not move."""
        ...

    def accelerator(self, verdict: Verdict) -> str:
        """What runs such guests on this host, in words for `rift doctor`."""
        ...

    def missing_tools(self) -> str | None:
        """What this host lacks to start such guests (`rift doctor`), or None."""
        ...


def reach(vm: Vm, port: P) -> P:
    """The guest port `port` (its files, its execs) for a running VM whose guest has
    the SSH address its kind gave it when it was made (`GuestKind.ssh_port`);
    GuestUnreachable when it has none (the test driver's VMs), or when the port
    reaches no guest at all (rift.services.absent: no guest access)."""
    if vm.ssh_port is None:
        raise GuestUnreachable(vm.id, f"host {vm.host} runs no guest behind its domains "
                               "(libvirt's test driver)")
    port.reachable(vm)
    return port


def mac_of(vm_id: str) -> str:
    """A VM's own MAC address, from its id (locally administered, QEMU's prefix):
    what a fork's guest is given in place of its source's."""
    tail = hashlib.sha256(vm_id.encode()).digest()[:3]
    return "52:54:00:" + ":".join(f"{b:02x}" for b in tail)


def serial_log(runtime: GuestRuntime, vm_id: str) -> Path:
    """The file the VM's serial console writes to."""
    return runtime.serial_dir / f"{vm_id}.log"


class VmFiles:
    """Each VM's own files on this control plane, named after the VM id: its
    serial log and, for images that need them, its overlay and seed. There are
    none without a guest runtime."""

    def __init__(self, runtime: GuestRuntime | None) -> None:
        self.runtime = runtime

    def remove(self, vm_id: str) -> None:
        """Delete the VM's files; absent is fine."""
        if self.runtime is None:
            return
        serial_log(self.runtime, vm_id).unlink(missing_ok=True)
        remove_vm_disks(self.runtime.vm_disks_dir, vm_id)

    def overlay_path(self, vm_id: str) -> Path | None:
        """Where the VM's overlay is, on this machine and on a host elsewhere alike
        (it may have none); None without a guest runtime."""
        if self.runtime is None:
            return None
        return vm_disks(self.runtime.vm_disks_dir.resolve(), vm_id).overlay

    def with_disks(self) -> set[str]:
        """The ids of the VMs that have an overlay or a seed here."""
        return set() if self.runtime is None else vm_ids_with_disks(self.runtime.vm_disks_dir)


def real_runtime(runtime: Runtime) -> GuestRuntime | None:
    """The runtime of real guests; None on a control plane without
    (rift.services.absent.NoRuntime): where a kind of guest is chosen, once."""
    return runtime if isinstance(runtime, GuestRuntime) else None


def vm_files(deps: Deps) -> VmFiles:
    return VmFiles(real_runtime(deps.runtime))
