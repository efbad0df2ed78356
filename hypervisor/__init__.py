"""Hosts for Rift's VMs: the Hypervisor port, its libvirt adapter and a fake.

Imports no rift module. libvirt itself is imported only by
`hypervisor.libvirt`, which `open_hypervisor` loads when first asked for a
libvirt URI.
"""

from hypervisor.base import (
    DomainRecord,
    DomainSpec,
    HostInfo,
    Hypervisor,
    HypervisorError,
    ImageError,
)
from hypervisor.domain_xml import (
    QEMU_XMLNS,
    RIFT_XMLNS,
    build_domain_xml,
    parse_rift_metadata,
    validate_spec,
)
from hypervisor.factory import open_hypervisor
from hypervisor.fake import FakeDomain, FakeHypervisor
from hypervisor.placement import HostLoad, choose_host, largest_free
from hypervisor.testhost import write_test_host_xml

__all__ = [
    "QEMU_XMLNS",
    "RIFT_XMLNS",
    "DomainRecord",
    "DomainSpec",
    "FakeDomain",
    "FakeHypervisor",
    "HostInfo",
    "HostLoad",
    "Hypervisor",
    "HypervisorError",
    "ImageError",
    "build_domain_xml",
    "choose_host",
    "largest_free",
    "open_hypervisor",
    "parse_rift_metadata",
    "validate_spec",
    "write_test_host_xml",
]
