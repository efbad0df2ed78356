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
    removal does; `stay` makes the live unplug refuse while the disk stays; the
    running side lets go of an unplugged disk after `late` more reads of it (as
    libvirt answers a live unplug before the guest has finished it)."""

    def __init__(self, live: list[VolumeDisk], config: list[VolumeDisk], *,
                 vanish: bool = False, stay: bool = False, late: int = 0) -> None:
        self.sides = {LIVE: list(live), CONFIG: list(config)}
        self.vanish, self.stay, self.late = vanish, stay, late
        self.releasing: list[VolumeDisk] = []
        self.unplugged: list[tuple[int, str]] = []

    def isActive(self) -> int:
        return 1

    def XMLDesc(self, flags: int) -> str:
        side = self.sides[CONFIG if flags & libvirt.VIR_DOMAIN_XML_INACTIVE else LIVE]
        if side is self.sides[LIVE] and self.releasing:
            if self.late == 0:
                side.remove(self.releasing.pop())
            self.late -= 1
        return "<domain><devices>" + "".join(disk_xml(d) for d in side) + "</devices></domain>"

    def detachDeviceFlags(self, xml: str, flag: int) -> None:
        side = self.sides[flag]
        found = next(d for d in side if f"dev=\"{d.target}\"" in xml)
        if flag == LIVE and (self.vanish or self.stay):
            if self.vanish:
                side.remove(found)
            raise missing(found.target)
        if flag == LIVE and self.late:
            self.releasing.append(found)
        else:
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


def hypervisor(dom: Domain, wait_s: float = 5.0) -> LibvirtHypervisor:
    conn: Any = Connection(dom)
    made = LibvirtHypervisor("qemu:///system", opener=lambda uri: conn)
    made.unplug_wait_s = wait_s
    return made


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


def test_a_detach_answers_once_the_running_domain_let_go_of_the_disk() -> None:
    dom = Domain([DISK], [DISK], late=3)
    hypervisor(dom).detach_disk("rift-vm_x", DISK)
    assert dom.sides == {LIVE: [], CONFIG: []}
    assert dom.late < 0  # the running side was read until it let go


def test_a_disk_the_guest_does_not_let_go_of_is_an_error_and_stays_in_the_definition() -> None:
    dom = Domain([DISK], [DISK], late=10_000)
    with pytest.raises(HypervisorError, match=r"did not let go of its disk vdc within 0\.3 s"):
        hypervisor(dom, wait_s=0.3).detach_disk("rift-vm_x", DISK)
    assert dom.sides[CONFIG] == [DISK]  # a later detach finishes it
