"""Kinds with a real guest behind the domain: kernel images booted with Rift's
own init, and operators' qcow2 images with cloud-init."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from hypervisor.base import DomainSpec, GuestDomain, HypervisorError, ImageError, elsewhere
from hypervisor.disks import iso_maker as seed_maker
from hypervisor.disks import make_overlay, remove_vm_disks, vm_disks
from hypervisor.image_files import ImageFiles, image_files
from hypervisor.kernel_boot import guest_spec
from hypervisor.qcow2 import (
    KIND_QCOW2,
    Qcow2Image,
    prepare_vm_disks,
    qcow2_guest_spec,
    qcow2_image,
)
from hypervisor.snapshot_image import snapshot_image
from rift.domain.builds import LAYER_PREFIX
from rift.domain.errors import GuestUnreachable
from rift.domain.model import DEFAULT_DISK_GIB, StartKind, Vm
from rift.services.context import GuestRuntime
from rift.services.lifecycle.guest_kinds.base import (
    NotReady,
    Verdict,
    VmFiles,
    mac_of,
    serial_log,
)
from rift.services.ports import Guests, HostFiles, Overlay

__all__ = ["DEFAULT_DISK_GIB", "GIB", "KernelGuest", "Qcow2Guest", "SnapshotGuest"]


class _RealGuest:
    """What every kind with a real guest shares: a forwarded SSH port, the task's
    key, the boot wait, and the VM's files."""

    label = "real"
    start_kind: StartKind = "boot"
    markers = True  # the guest's init prints a ready marker on the serial console

    def __init__(self, uri: str, image: str, runtime: GuestRuntime,
                 guests: Guests, files: VmFiles) -> None:
        self.uri = uri
        self.image = image
        self.runtime = runtime
        self.guests = guests
        self.files = files

    def ssh_port(self, free_port: Callable[[], int]) -> int | None:
        return free_port()

    def _serial_log(self, vm: Vm) -> Path:
        return serial_log(self.runtime, vm.id)

    def _domain(self, vm: Vm) -> GuestDomain:
        """The VM's domain as any kind boots it: its names, size, SSH port and log."""
        assert vm.ssh_port is not None
        return GuestDomain(
            name=vm.domain_name, task_id=vm.task_id, vm_id=vm.id, vcpus=vm.vcpus,
            memory_mib=vm.memory_mib, domain_type=self.runtime.accel(self.uri),
            ssh_port=vm.ssh_port, serial_log=self._serial_log(vm))

    def wait_ready(self, vm: Vm) -> None:
        timeout_s = self.runtime.boot_timeout_s
        try:
            self.guests.lifecycle.wait_ready(vm, self._serial_log(vm), timeout_s,
                                             markers=self.markers)
        except GuestUnreachable as exc:
            raise NotReady(f"the guest did not answer SSH within {timeout_s:.0f}s: "
                           f"{exc.message}") from exc

    def clean_up(self, vm_id: str) -> None:
        self.files.remove(vm_id)

    def receive(self, vm: Vm, host_files: HostFiles) -> None:
        raise HypervisorError("migrate", f"VMs of {self.label} images do not move yet")

    def accelerator(self, verdict: Verdict) -> str:
        if not os.path.exists("/dev/kvm"):
            return "no /dev/kvm: guests run under TCG (domain type qemu; slower, works)"
        accel, why = verdict(self.uri)
        if accel == "kvm":
            return f"guests boot under KVM: {why}"
        return f"guests run under TCG (domain type qemu): {why}"

    def missing_tools(self) -> str | None:
        return None


GIB = 1 << 30


def own_overlay(runtime: GuestRuntime, vm_id: str, base: Path, size_bytes: int) -> Path:
    """The VM's copy-on-write overlay of `base` (sparse, of `size_bytes`), made in
    its disks folder; ImageError, with nothing left behind, when it cannot be."""
    disks_dir = runtime.vm_disks_dir.resolve()
    disks_dir.mkdir(parents=True, exist_ok=True)
    overlay = vm_disks(disks_dir, vm_id).overlay
    try:
        make_overlay(base, overlay, size_bytes)
    except ImageError:
        remove_vm_disks(disks_dir, vm_id)
        raise
    return overlay


class KernelGuest(_RealGuest):
    """A kernel image booted directly with Rift's init; the key rides on the
    kernel command line, and the init prints its ready marker. An image with a
    root disk (`debian`) gets, per VM, a sparse copy-on-write overlay of its
    read-only base disk as vda, of the VM's `disk_gib` (never smaller than the base),
    which the init mounts as the root and `clean_up` removes."""

    label = "kernel"

    def check(self) -> None:
        image_files(self.runtime.images_dir, self.image)

    def plan(self, vm: Vm) -> DomainSpec:
        keys = self.guests.keys
        assert vm.ssh_port is not None
        image = image_files(self.runtime.images_dir, self.image)
        return guest_spec(image, self._domain(vm), keys.task_key(vm.task_id),
                          self._overlay(image, vm))

    def receive(self, vm: Vm, host_files: HostFiles) -> None:
        """The image's kernel, initrd and base disk here, the folder of the VM's serial
        log, and an empty overlay of its size (the migration fills it)."""
        try:
            image = image_files(self.runtime.images_dir, self.image)
        except ImageError as exc:
            raise HypervisorError("migrate", str(exc)) from exc
        disks = vm_disks(self.runtime.vm_disks_dir.resolve(), vm.id)
        size = max(vm.disk_gib * GIB, image.disk_bytes)
        if not elsewhere(self.uri):  # this machine: its files are here
            if image.disk is not None:
                try:
                    make_overlay(image.disk, disks.overlay, size)
                except ImageError as exc:
                    raise HypervisorError("migrate", str(exc)) from exc
            return
        host_files.receive(self.uri, DomainSpec(
            name=vm.domain_name, task_id=vm.task_id, vm_id=vm.id, vcpus=vm.vcpus,
            memory_mib=vm.memory_mib, image=vm.image, domain_type="qemu",
            kernel=str(image.kernel), initrd=str(image.initrd),
            serial_log=str(self._serial_log(vm))),
            None if image.disk is None else Overlay(base=str(image.disk),
                                                    path=str(disks.overlay), size_bytes=size))

    def _overlay(self, image: ImageFiles, vm: Vm) -> Path | None:
        """The VM's overlay of the image's base disk, made here; None without one."""
        if image.disk is None:
            return None
        return own_overlay(self.runtime, vm.id, image.disk,
                           max(vm.disk_gib * GIB, image.disk_bytes))


class Qcow2Guest(_RealGuest):
    """An operator's qcow2 image with cloud-init: its own overlay (of the VM's
    `disk_gib`, never smaller than the image; cloud-init grows the root into it) and
    a seed with the task's key. Its cloud-init prints no ready marker: only SSH
    counts."""

    label = "qcow2"
    markers = False

    def check(self) -> None:
        qcow2_image(self.runtime.images_dir, self.image)

    def plan(self, vm: Vm) -> DomainSpec:
        keys = self.guests.keys
        assert vm.ssh_port is not None
        image = qcow2_image(self.runtime.images_dir, self.image)
        disks = prepare_vm_disks(image, self.runtime.vm_disks_dir, vm_id=vm.id,
                                 public_key_line=keys.task_key(vm.task_id),
                                 size_bytes=vm.disk_gib * GIB)
        return qcow2_guest_spec(image, disks, self._domain(vm))

    def missing_tools(self) -> str | None:
        try:
            seed_maker()
        except ImageError as exc:
            return str(exc)  # names the package that writes the cloud-init seed
        return None


class SnapshotGuest(_RealGuest):
    """An image made from a snapshot (hypervisor.snapshot_image): each VM is a fork
    of the image's saved state, started by libvirt from its own copy of it
    (`DomainSpec.restore_from`), on its own overlay of the image's disk (of the
    disk's size: the saved kernel knows it) and, for a state of a qcow2 image,
    with a cloud-init seed of its own. Once it answers (logging in with the
    image's key, which the hand-over swaps for the VM's own at once) it gets an
    identity of its own, as every fork does. A VM of a layer (a build's, SPEC §19:
    only builds start them) keeps its layer's host key and SSH server, so its state
    can be saved at once; a built image's VMs get their own at their start."""

    label = "snapshot"
    start_kind: StartKind = "fork"  # of the image's saved state

    def check(self) -> None:
        snapshot_image(self.runtime.images_dir, self.image)

    def plan(self, vm: Vm) -> DomainSpec:
        keys = self.guests.keys
        assert vm.ssh_port is not None
        image = snapshot_image(self.runtime.images_dir, self.image)
        # The key the VM is handed over to (its task's, its pool's), made on first use.
        key_line = keys.task_key(vm.task_id)
        disk = seed = None
        if image.disk is not None:
            if image.origin_kind == KIND_QCOW2:
                disks = prepare_vm_disks(
                    Qcow2Image(self.image, image.disk, image.disk_bytes),
                    self.runtime.vm_disks_dir, vm_id=vm.id, public_key_line=key_line)
                disk, seed = str(disks.overlay), str(disks.seed)
            else:
                disk = str(own_overlay(self.runtime, vm.id, image.disk, image.disk_bytes))
        return DomainSpec(
            name=vm.domain_name, task_id=vm.task_id, vm_id=vm.id, vcpus=vm.vcpus,
            memory_mib=vm.memory_mib, image=self.image,
            domain_type=self.runtime.accel(self.uri), ssh_port=vm.ssh_port,
            serial_log=str(self._serial_log(vm)), disk=disk, seed=seed,
            restore_from=str(image.state))

    def wait_ready(self, vm: Vm) -> None:
        image = snapshot_image(self.runtime.images_dir, self.image)
        timeout_s = self.runtime.boot_timeout_s
        try:
            life = self.guests.lifecycle
            fork = life.layer_forked if self.image.startswith(LAYER_PREFIX) else life.forked
            fork(vm, image.host_key, mac_of(vm.id), timeout_s, boot_key=image.key)
        except GuestUnreachable as exc:
            raise NotReady(f"the guest did not answer SSH within {timeout_s:.0f}s of its "
                           f"restore: {exc.message}") from exc
