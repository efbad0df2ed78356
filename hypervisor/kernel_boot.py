"""Booting a kernel image with Rift's own init (`guest_init.sh`): the kernel
command line that carries the task's key, the markers the init prints on the
serial console, and the DomainSpec of such a guest."""

from __future__ import annotations

import base64
from pathlib import Path

from hypervisor.base import DomainSpec, GuestDomain
from hypervisor.image_files import ImageFiles

READY_MARKER = "RIFT-READY"
INIT_MARKER = "RIFT-INIT"
FAILED_MARKER = "RIFT-FAILED"
HOSTKEY_MARKER = "RIFT-HOSTKEY"
# Kernel command line of every kernel image's guest; the key is appended per VM.
CMDLINE_BASE = "console=ttyS0 quiet panic=-1"


def guest_cmdline(image: ImageFiles, public_key_line: str) -> str:
    """The kernel command line that boots `image` with `public_key_line` authorized for root."""
    encoded = base64.b64encode(public_key_line.strip().encode()).decode("ascii")
    return f"{image.cmdline_base} rift.key={encoded}"


def guest_spec(image: ImageFiles, domain: GuestDomain, public_key_line: str,
               disk: Path | None = None) -> DomainSpec:
    """The DomainSpec that boots `image` with SSH on 127.0.0.1:`domain.ssh_port` for
    that key; `disk` (the VM's overlay of the image's base disk) is its vda."""
    return DomainSpec(
        name=domain.name, task_id=domain.task_id, vm_id=domain.vm_id, vcpus=domain.vcpus,
        memory_mib=domain.memory_mib, image=image.name, domain_type=domain.domain_type,
        kernel=str(image.kernel), initrd=str(image.initrd),
        cmdline=guest_cmdline(image, public_key_line), ssh_port=domain.ssh_port,
        serial_log=str(domain.serial_log), disk=None if disk is None else str(disk),
    )
