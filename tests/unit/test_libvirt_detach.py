"""Unplugging a volume's disk (hypervisor/libvirt.py `detach_disk`) against a domain
whose running side may lose the disk on its own: libvirt removes a device once the
guest's unplug of it lands, which may be after the detach call that asked for it
returned (seen: a bench's next detach of that target refused "disk vdc not found",
and the row stayed attached, each later detach refused alike)."""

from __future__ import annotations

from typing import Any

import libvirt
import pytest

from hypervisor.base import HypervisorError, VolumeDisk
from hypervisor.libvirt import LibvirtHypervisor
from hypervisor.volumes import disk_xml

LIVE, CONFIG = libvirt.VIR_DOMAIN_AFFECT_LIVE, libvirt.VIR_DOMAIN_AFFECT_CONFIG
DISK = VolumeDisk("/data/volumes/vol_aaaaaaaa.qcow2", "vdc", "vol_aaaaaaaa")


def missing(target: str) -> libvirt.libvirtError:
    err = libvirt.libvirtError(f"device not found: disk {target} not found")
    err.err = (libvirt.VIR_ERR_DEVICE_MISSING, 0, str(err), 0, "", "", "", 0, 0)
    return err


class Domain:  # libvirt's method names
    """The two sides of a running domain, each a list of disks; `vanish` takes the
    disk off the running side just before the live unplug reaches it, as a late
    removal does; `stay` makes the live unplug refuse while the disk stays."""

    def __init__(self, live: list[VolumeDisk], config: list[VolumeDisk], *,
                 vanish: bool = False, stay: bool = False) -> None:
        self.sides = {LIVE: list(live), CONFIG: list(config)}
        self.vanish, self.stay = vanish, stay
        self.unplugged: list[tuple[int, str]] = []

    def isActive(self) -> int:
        return 1

    def XMLDesc(self, flags: int) -> str:
        side = self.sides[CONFIG if flags & libvirt.VIR_DOMAIN_XML_INACTIVE else LIVE]
        return "<domain><devices>" + "".join(disk_xml(d) for d in side) + "</devices></domain>"

    def detachDeviceFlags(self, xml: str, flag: int) -> None:
        side = self.sides[flag]
        found = next(d for d in side if f"dev=\"{d.target}\"" in xml)
        if flag == LIVE and (self.vanish or self.stay):
            if self.vanish:
                side.remove(found)
            raise missing(found.target)
        side.remove(found)
        self.unplugged.append((flag, found.target))


class Connection:
    def __init__(self, dom: Domain) -> None:
        self.dom = dom

    def isAlive(self) -> int:
        return 1

    def getType(self) -> str:
        return "QEMU"

    def lookupByName(self, name: str) -> Domain:
        return self.dom


def hypervisor(dom: Domain) -> LibvirtHypervisor:
    conn: Any = Connection(dom)
    return LibvirtHypervisor("qemu:///system", opener=lambda uri: conn)


def test_both_sides_unplug_the_disk_they_hold() -> None:
    moved = VolumeDisk(DISK.path, "vdd", DISK.serial)  # the definition holds it elsewhere
    dom = Domain([DISK], [moved])
    hypervisor(dom).detach_disk("rift-vm_x", DISK)
    assert dom.unplugged == [(LIVE, "vdc"), (CONFIG, "vdd")]
    assert dom.sides == {LIVE: [], CONFIG: []}


def test_a_disk_the_running_domain_lost_meanwhile_is_unplugged_from_its_definition() -> None:
    dom = Domain([DISK], [DISK], vanish=True)
    hypervisor(dom).detach_disk("rift-vm_x", DISK)
    assert dom.unplugged == [(CONFIG, "vdc")]
    assert dom.sides == {LIVE: [], CONFIG: []}


def test_a_refusal_while_the_disk_is_still_there_is_an_error() -> None:
    dom = Domain([DISK], [DISK], stay=True)
    with pytest.raises(HypervisorError, match="disk vdc not found"):
        hypervisor(dom).detach_disk("rift-vm_x", DISK)
    assert dom.sides[CONFIG] == [DISK]  # nothing further done
