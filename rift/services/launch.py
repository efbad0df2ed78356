"""Starting a VM's domain: plan it (test driver, or a real guest with its image,
accelerator, task key and SSH port), create it, wait until the guest answers,
and record `running` or `failed` (libvirt's or the guest's own words)."""

from __future__ import annotations

import random
import socket
from contextlib import suppress
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from hypervisor.base import DomainSpec, HypervisorError, ImageError
from hypervisor.image_files import image_files
from hypervisor.kernel_boot import guest_spec as real_guest_spec
from hypervisor.qcow2 import (
    KIND_QCOW2,
    image_kind,
    prepare_vm_disks,
    qcow2_guest_spec,
    qcow2_image,
)
from rift.domain.errors import GuestUnreachable, HypervisorFailed, ImageNotFound
from rift.domain.model import NewEvent, Task, Vm
from rift.services.context import Caller, Deps, GuestRuntime
from rift.services.ports import GuestShell, Tx
from rift.services.teardown import destroy_domain, destroy_vm, remove_disks

SSH_HOST = "127.0.0.1"
PORTS = (20000, 60000)


def is_test_host(uri: str) -> bool:
    """libvirt's test driver (or the in-memory fake): domains with no guest behind them.
    The driver is the URI scheme before any `+transport`: `test+unix:///default` is
    the test driver inside libvirtd, one host that every client (replica) shares."""
    driver = uri.split(":", 1)[0].split("+", 1)[0]
    return driver in ("test", "fake")


def serial_log(runtime: GuestRuntime, vm_id: str) -> Path:
    return runtime.serial_dir / f"{vm_id}.log"


def check_image(deps: Deps, image: str, uri: str) -> None:
    """On a real host the image must be built, not only known."""
    if is_test_host(uri) or deps.runtime is None:
        return
    try:
        _check_built(deps.runtime, image)
    except ImageError as exc:
        built = [n for n in deps.images.names() if _built(deps.runtime, n)]
        raise ImageNotFound(image, built, hint=f"the operator builds it: rift image build "
                            f"{image}" if image == "tiny" else "rift_vm_new with one of those "
                            "images") from exc


def _built(runtime: GuestRuntime, name: str) -> bool:
    try:
        _check_built(runtime, name)
    except ImageError:
        return False
    return True


def _is_qcow2(runtime: GuestRuntime, name: str) -> bool:
    return image_kind(runtime.images_dir, name) == KIND_QCOW2


def _check_built(runtime: GuestRuntime, name: str) -> None:
    """ImageError unless the image's files are there: a registered qcow2's disk, or
    a kernel and an initramfs."""
    if _is_qcow2(runtime, name):
        qcow2_image(runtime.images_dir, name)
    else:
        image_files(runtime.images_dir, name)


def pick_ssh_port(tx: Tx, host: str) -> int:
    """A loopback port no live VM of the host uses and that is free right now."""
    taken = {vm.ssh_port for vm in tx.live_vms_on_host(host) if vm.ssh_port}
    for _ in range(200):
        port = random.randrange(*PORTS)
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((SSH_HOST, port))
            except OSError:
                continue
        return port
    raise HypervisorFailed("no free loopback port for the guest's SSH", host=host)


def plan(deps: Deps, vm: Vm, uri: str) -> DomainSpec:
    """The domain for ``vm``, marked with this installation (reconciliation's scope)."""
    return replace(_plan(deps, vm, uri), install=deps.install_id)


def _plan(deps: Deps, vm: Vm, uri: str) -> DomainSpec:
    if is_test_host(uri):
        return DomainSpec(name=vm.domain_name, task_id=vm.task_id, vm_id=vm.id,
                          vcpus=vm.vcpus, memory_mib=vm.memory_mib, image=vm.image,
                          domain_type="test")
    runtime, guests = _real(deps, vm)
    assert vm.ssh_port is not None
    if _is_qcow2(runtime, vm.image):
        # Its own overlay on the image and a cloud-init seed with the task's key.
        image = qcow2_image(runtime.images_dir, vm.image)
        disks = prepare_vm_disks(image, runtime.vm_disks_dir, vm_id=vm.id,
                                 public_key_line=guests.task_key(vm.task_id))
        return qcow2_guest_spec(
            image, disks, name=vm.domain_name, task_id=vm.task_id, vm_id=vm.id,
            vcpus=vm.vcpus, memory_mib=vm.memory_mib, domain_type=runtime.accel(uri),
            ssh_port=vm.ssh_port, serial_log=serial_log(runtime, vm.id))
    return real_guest_spec(
        image_files(runtime.images_dir, vm.image), name=vm.domain_name, task_id=vm.task_id,
        vm_id=vm.id, vcpus=vm.vcpus, memory_mib=vm.memory_mib, domain_type=runtime.accel(uri),
        public_key_line=guests.task_key(vm.task_id), ssh_port=vm.ssh_port,
        serial_log=serial_log(runtime, vm.id))


def _real(deps: Deps, vm: Vm) -> tuple[GuestRuntime, GuestShell]:
    if deps.runtime is None or deps.guests is None:
        raise HypervisorFailed("this control plane runs no real guests (no guest runtime)",
                               host=vm.host)
    return deps.runtime, deps.guests


def _failed(deps: Deps, caller: Caller, vm: Vm, error: str) -> Vm:
    now = deps.clock.now()
    with deps.store.write() as tx:
        if tx.update_vm(vm.id, ("creating",), status="failed", error=error):
            tx.add_event(NewEvent(vm.task_id, "vm_failed", now, caller.label,
                                  {"vm_id": vm.id, "error": error}))
        return tx.get_vm(vm.id) or vm


def launch(deps: Deps, caller: Caller, vm: Vm, uri: str) -> Vm:
    started = deps.clock.now()
    try:
        deps.hosts.hypervisor(uri).create(plan(deps, vm, uri))
    except (HypervisorError, ImageError, HypervisorFailed) as exc:
        remove_disks(deps, vm.id)  # nothing was defined: the overlay and seed are unused
        return _failed(deps, caller, vm, str(exc))
    if not is_test_host(uri):
        runtime, guests = _real(deps, vm)
        try:
            # A qcow2 image's cloud-init prints no ready marker: only SSH counts.
            guests.wait_ready(vm, serial_log(runtime, vm.id), runtime.boot_timeout_s,
                              markers=not _is_qcow2(runtime, vm.image))
        except GuestUnreachable as exc:
            guests.close_vm(vm.id)
            # If libvirt refuses, the row still turns failed (not live), so the
            # next sweep's reconciliation destroys the orphaned domain.
            with suppress(HypervisorFailed):
                destroy_domain(deps, vm, uri)
            return _failed(deps, caller, vm, f"the guest did not answer SSH within "
                           f"{runtime.boot_timeout_s:.0f}s: {exc.message}")
    return _running(deps, caller, vm, uri, started)


def _running(deps: Deps, caller: Caller, vm: Vm, uri: str, started: datetime) -> Vm:
    now = deps.clock.now()
    boot_s = (now - started).total_seconds()
    task: Task | None = None
    with deps.store.write() as tx:
        won = tx.update_vm(vm.id, ("creating",), status="running", ready_at=now)
        if won:
            tx.add_event(NewEvent(vm.task_id, "vm_running", now, caller.label,
                                  {"vm_id": vm.id, "boot_s": boot_s}))
            task = tx.get_task(vm.task_id)
    if not won or (task is not None and not task.is_open):
        # The task closed (or the VM was destroyed) while it was starting: take the
        # domain down again so nothing runs without a live row.
        destroy_domain(deps, vm, uri)
        with deps.store.read() as tx:
            current = tx.get_vm(vm.id) or vm
        if current.is_live:
            return destroy_vm(deps, current, caller.label, {"reason": "task closed"})
        return current
    deps.observers.vm_booted(boot_s)
    deps.log.info("vm running", extra={"vm_id": vm.id, "task_id": vm.task_id, "host": vm.host,
                                       "boot_s": round(boot_s, 3)})
    return replace(vm, status="running", ready_at=now)
