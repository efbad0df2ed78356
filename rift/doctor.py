"""`rift doctor`: what works here, and what to do about what does not."""

from __future__ import annotations

import os
from collections.abc import Callable

from rift.config import Settings
from rift.services.launch import is_test_host

Check = tuple[str, bool, str]


def _database(settings: Settings) -> Check:
    from rift.store.migrate import current_revision, head_revision

    url = settings.resolved_database_url()
    try:
        current = current_revision(url)
    except Exception as exc:
        return ("database", False, f"{url.split('@')[-1]}: {exc}; check RIFT_DATABASE_URL")
    head = head_revision()
    if current != head:
        return ("database", False, f"schema at {current}, code wants {head}; "
                "`rift serve` migrates at start")
    return ("database", True, f"schema at {current}")


def _libvirt(settings: Settings) -> Check:
    from hypervisor import HypervisorError, open_hypervisor

    try:
        hv = open_hypervisor(settings.hypervisor_uri)
        info = hv.info()
        hv.close()
    except HypervisorError as exc:
        return ("libvirt", False, f"{settings.hypervisor_uri}: {exc}; `make run` installs and "
                "starts libvirtd, or set RIFT_HYPERVISOR_URI=test:///default")
    return ("libvirt", True, f"{settings.hypervisor_uri}: {info.driver} driver, "
            f"{info.vcpus} vCPUs, {info.memory_mib} MiB")


def _kvm(settings: Settings) -> Check:
    if is_test_host(settings.hypervisor_uri):
        return ("kvm", True, "test driver: no guests, no accelerator needed")
    if not os.path.exists("/dev/kvm"):
        return ("kvm", True, "no /dev/kvm: guests run under TCG (domain type qemu; slower, "
                "works)")
    from rift.bootstrap import Accelerators

    accel, why = Accelerators(settings.data_dir / "images").verdict(settings.hypervisor_uri)
    if accel == "kvm":
        return ("kvm", True, f"guests boot under KVM: {why}")
    return ("kvm", True, f"guests run under TCG (domain type qemu): {why}")


def _images(settings: Settings) -> Check:
    from rift.catalog import DirectoryImages

    images = DirectoryImages(settings.data_dir / "images")
    built = [n for n in images.names() if images.is_built(n)]
    if is_test_host(settings.hypervisor_uri):
        return ("images", True, f"test driver: every known image is accepted ({images.names()})")
    if not built:
        return ("images", False, "no image is built; rift image build tiny")
    qcow2 = [n for n in built if images.kind(n) == "qcow2"]
    if qcow2:
        from hypervisor.base import ImageError
        from hypervisor.disks import iso_maker

        try:
            iso_maker()
        except ImageError as exc:
            return ("images", False, f"VMs of {', '.join(qcow2)} cannot get their cloud-init "
                    f"seed: {exc}")
    return ("images", True, "built: " + ", ".join(
        f"{n} (qcow2)" if n in qcow2 else n for n in built))


CHECKS: tuple[Callable[[Settings], Check], ...] = (_database, _libvirt, _kvm, _images)


def run_doctor(settings: Settings) -> int:
    failed = 0
    for check in CHECKS:
        name, ok, text = check(settings)
        failed += not ok
        print(f"{'ok ' if ok else 'NO '} {name:<9} {text}")
    return 1 if failed else 0
