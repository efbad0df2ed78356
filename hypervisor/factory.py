"""Opening a Hypervisor by URI; libvirt is imported only when a libvirt URI is opened."""

from __future__ import annotations

from hypervisor.base import CpuLimits, Hypervisor
from hypervisor.host_disk import LOCAL_DISK, HostDisk


def open_hypervisor(uri: str, *, validate: bool = False, disk: HostDisk = LOCAL_DISK,
                    cpu: CpuLimits | None = None) -> Hypervisor:
    """A Hypervisor for `uri`: `fake:///...` in memory, anything else through libvirt;
    `disk`: the files of the machine its libvirt runs on (this one's by default);
    `cpu`: its guests' CPU limits.

    The libvirt connection itself opens on first use, so this never blocks.
    """
    if uri.startswith("fake:"):
        from hypervisor.fake import FakeHypervisor

        return FakeHypervisor(uri)
    from hypervisor.libvirt import LibvirtHypervisor

    return LibvirtHypervisor(uri, validate=validate, disk=disk, cpu=cpu)
