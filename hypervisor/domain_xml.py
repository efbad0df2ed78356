"""Libvirt domain XML: built from a DomainSpec, and Rift metadata read back.

Pure functions over strings; no libvirt here. Every value from a spec goes into
the tree as element text or an attribute value, so ElementTree escapes it.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

from hypervisor.base import CPU_PERIOD_US, PROXIED_GROUP, DomainSpec

RIFT_XMLNS = "https://rift.dev/xmlns/domain/1"
QEMU_XMLNS = "http://libvirt.org/schemas/domain/qemu/1.0"
DOMAIN_TYPES = frozenset({"test", "qemu", "kvm"})
TCG_TB_CACHE_MIB = (32, 256)  # the least and the most of a TCG guest's translation cache


def tcg_tb_cache_mib(memory_mib: int) -> int:
    """The TCG translation cache of a guest of `memory_mib`: half its memory, within
    TCG_TB_CACHE_MIB. QEMU fills it as it translates guest code (host memory grows
    only as far as the guest's code does) and, once full, throws all of it away and
    translates again: a `debian` guest's sshd, bash and libraries outgrow 32 MiB
    (its boot alone makes ~150 MiB of code), and with a cache that small every exec
    paid for translating them anew (a `true` 190-380 ms, against 170-200 ms with
    256 MiB; a fork's first exec 430-470 ms against 190-240 ms)."""
    least, most = TCG_TB_CACHE_MIB
    return max(least, min(most, memory_mib // 2))

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
# Characters XML 1.0 cannot carry at all, even escaped.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_RIFT_VM = f"{{{RIFT_XMLNS}}}vm"
# The start tag of the Rift element as libvirt writes it back (libxml2 escapes
# `<`, `>`, `&` and quotes inside attribute values, so no `>` ends it early).
_RIFT_TAG = re.compile(
    r"<(?P<prefix>[A-Za-z_][\w.-]*):vm\s[^>]*xmlns:(?P=prefix)=([\"'])"
    + re.escape(RIFT_XMLNS) + r"\2[^>]*>")
_TASK_ATTR = re.compile(r"""(\stask=)(?:"[^"]*"|'[^']*')""")
_ATTR_ESCAPES = {'"': "&quot;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}


def build_domain_xml(spec: DomainSpec) -> str:
    """The domain XML for `spec`; ValueError when the spec cannot be rendered."""
    validate_spec(spec)
    root = ET.Element("domain", type=spec.domain_type)
    guest = spec.domain_type != "test"
    if guest and spec.ssh_port is not None:
        # Literal prefixes keep each namespace declared where libvirt expects it.
        root.set("xmlns:qemu", QEMU_XMLNS)
    ET.SubElement(root, "name").text = spec.name
    metadata = ET.SubElement(root, "metadata")
    mark = {"xmlns:rift": RIFT_XMLNS, "task": spec.task_id, "vm": spec.vm_id, "image": spec.image}
    if spec.install is not None:
        mark["install"] = spec.install
    ET.SubElement(metadata, "rift:vm", mark)
    ET.SubElement(root, "memory", unit="KiB").text = str(spec.memory_mib * 1024)
    ET.SubElement(root, "vcpu").text = str(spec.vcpus)
    if guest:
        _cputune(root, spec)
    os_el = ET.SubElement(root, "os")
    if not guest:
        ET.SubElement(os_el, "type").text = "hvm"
    else:
        _guest_parts(root, os_el, spec)
    return ET.tostring(root, encoding="unicode")

# Root ports of a guest: its rng, disk and seed take three, volumes the rest.
PCIE_ROOT_PORTS = 8


def _guest_parts(root: ET.Element, os_el: ET.Element, spec: DomainSpec) -> None:
    """The parts of a real qemu/kvm guest: q35, kernel, rng, serial, user network."""
    ET.SubElement(os_el, "type", arch="x86_64", machine="q35").text = "hvm"
    if spec.kernel is not None:
        ET.SubElement(os_el, "kernel").text = spec.kernel
        if spec.initrd is not None:
            ET.SubElement(os_el, "initrd").text = spec.initrd
        if spec.cmdline is not None:
            ET.SubElement(os_el, "cmdline").text = spec.cmdline
    elif spec.disk is None:
        ET.SubElement(os_el, "boot", dev="hd")
    features = ET.SubElement(root, "features")
    ET.SubElement(features, "acpi")
    if spec.domain_type == "qemu":
        # A translation cache sized by the guest (tcg_tb_cache_mib), not QEMU's
        # default (up to 1 GiB).
        tcg = ET.SubElement(features, "tcg")
        ET.SubElement(tcg, "tb-cache", unit="MiB").text = str(tcg_tb_cache_mib(spec.memory_mib))
    if spec.domain_type == "kvm":
        ET.SubElement(root, "cpu", mode="host-passthrough")
    ET.SubElement(root, "clock", offset="utc")
    ET.SubElement(root, "on_poweroff").text = "destroy"
    ET.SubElement(root, "on_reboot").text = "restart"
    ET.SubElement(root, "on_crash").text = "destroy"
    _process_label(root, spec)
    devices = ET.SubElement(root, "devices")
    ET.SubElement(devices, "controller", type="usb", model="none")
    _root_ports(devices)
    ET.SubElement(devices, "memballoon", model="none")
    rng = ET.SubElement(devices, "rng", model="virtio")
    ET.SubElement(rng, "backend", model="random").text = "/dev/urandom"
    if spec.disk is not None:
        disk = ET.SubElement(devices, "disk", type="file", device="disk")
        ET.SubElement(disk, "driver", name="qemu", type="qcow2", discard="unmap")
        ET.SubElement(disk, "source", file=spec.disk)
        ET.SubElement(disk, "target", dev="vda", bus="virtio")
        if spec.kernel is None:
            ET.SubElement(disk, "boot", order="1")  # never the seed
    if spec.seed is not None:
        # A read-only virtio disk, not a CD-ROM: cloud kernels (Debian's
        # linux-image-cloud-amd64) have virtio-blk but no SATA (AHCI) driver.
        seed = ET.SubElement(devices, "disk", type="file", device="disk")
        ET.SubElement(seed, "driver", name="qemu", type="raw")
        ET.SubElement(seed, "source", file=spec.seed)
        ET.SubElement(seed, "target", dev="vdb", bus="virtio")
        ET.SubElement(seed, "readonly")
    if spec.serial_log is not None:
        serial = ET.SubElement(devices, "serial", type="file")
        # append: written with O_APPEND, so Rift can cut the file (rift.guest.console)
        ET.SubElement(serial, "source", path=spec.serial_log, append="on")
        ET.SubElement(serial, "target", port="0")
    if spec.ssh_port is not None:
        commandline = ET.SubElement(root, "qemu:commandline")
        for value in (
            "-netdev",
            f"user,id=n0,{'restrict=on,' if spec.restrict else ''}"
            f"hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
            "-device",
            "virtio-net-pci,netdev=n0,addr=0x10",
        ):
            ET.SubElement(commandline, "qemu:arg", value=value)


def _root_ports(devices: ET.Element) -> None:
    """PCIe root ports for the guest's devices and volumes hot-plugged later (SPEC §18):
    q35's root bus takes none, and libvirt adds only as many as devices need."""
    ET.SubElement(devices, "controller", type="pci", index="0", model="pcie-root")
    for index in range(1, PCIE_ROOT_PORTS + 1):
        ET.SubElement(devices, "controller", type="pci", index=str(index),
                      model="pcie-root-port")


def _cputune(root: ET.Element, spec: DomainSpec) -> None:
    """The guest's CPU limits (`spec.cpu`): its weight as `<shares>`; a quota of each
    vCPU thread per period (`<period>`, `<quota>`), and one core for QEMU's other
    threads (`<emulator_period>`, `<emulator_quota>`). Nothing without limits."""
    cpu = spec.cpu
    if not cpu:
        return
    tune = ET.SubElement(root, "cputune")
    if cpu.weight:
        ET.SubElement(tune, "shares").text = str(max(2, cpu.weight))  # cgroup v1's least
    if cpu.quota_us:
        ET.SubElement(tune, "period").text = str(CPU_PERIOD_US)
        ET.SubElement(tune, "quota").text = str(cpu.quota_us)
        ET.SubElement(tune, "emulator_period").text = str(CPU_PERIOD_US)
        ET.SubElement(tune, "emulator_quota").text = str(CPU_PERIOD_US)


def _process_label(root: ET.Element, spec: DomainSpec) -> None:
    """A proxied guest's QEMU runs in the proxied group (libvirt's DAC driver), as the
    host's own QEMU user (`spec.qemu_uid`, qemu.conf's `user`: an unprivileged one of
    its own where the host is set up so; never a uid chosen here): the host's
    firewall knows its sockets by the group. ValueError without the uid."""
    if spec.proxied:
        if spec.qemu_uid is None:
            raise ValueError("a proxied guest needs its host's QEMU user (qemu_uid)")
        # relabel: the DAC driver gives its disks, kernel and seed to that user and group
        seclabel = ET.SubElement(root, "seclabel", type="static", model="dac", relabel="yes")
        ET.SubElement(seclabel, "label").text = f"+{int(spec.qemu_uid)}:{PROXIED_GROUP}"


_HOSTFWD = re.compile(r"hostfwd=tcp:127\.0\.0\.1:\d+-:22")


def domain_xml_with_ssh_port(xml: str, port: int) -> str:
    """A domain XML (as libvirt writes it) whose guest's SSH is forwarded from host
    port `port` instead (a migration's destination XML: every other byte is kept);
    one with no guest behind it (no forward) as it is. ValueError for several."""
    changed, count = _HOSTFWD.subn(f"hostfwd=tcp:127.0.0.1:{int(port)}-:22", xml)
    if count > 1:
        raise ValueError("the domain XML forwards more than one SSH port")
    return changed


def validate_spec(spec: DomainSpec) -> None:
    """Raise ValueError naming the first field that cannot go into a domain."""
    if not _NAME.fullmatch(spec.name):
        raise ValueError(f"domain name {spec.name!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]*")
    if spec.domain_type not in DOMAIN_TYPES:
        raise ValueError(f"domain_type {spec.domain_type!r} is not one of {sorted(DOMAIN_TYPES)}")
    if spec.vcpus < 1:
        raise ValueError(f"vcpus must be at least 1, not {spec.vcpus}")
    if spec.memory_mib < 1:
        raise ValueError(f"memory_mib must be at least 1, not {spec.memory_mib}")
    if spec.ssh_port is not None and not 1 <= spec.ssh_port <= 65535:
        raise ValueError(f"ssh_port {spec.ssh_port} is not a TCP port")
    texts = {
        "task_id": spec.task_id,
        "vm_id": spec.vm_id,
        "image": spec.image,
        "kernel": spec.kernel,
        "initrd": spec.initrd,
        "cmdline": spec.cmdline,
        "serial_log": spec.serial_log,
        "disk": spec.disk,
        "seed": spec.seed,
    }
    for field, value in texts.items():
        if value is not None and _NOT_XML.search(value):
            raise ValueError(f"{field} holds a character XML cannot carry")
    for field in ("kernel", "initrd", "serial_log", "disk", "seed"):
        path = texts[field]
        if path is not None and not path.startswith("/"):
            raise ValueError(f"{field} must be an absolute path, not {path!r}")


def rift_mark_with_task(xml: str, task_id: str) -> str:
    """The Rift metadata element of `xml` with its task id replaced by `task_id`.

    `xml` is a whole domain XML or the bare element virDomainGetMetadata returns;
    every other attribute (VM id, image, installation) is kept. The answer is the
    bare element `<vm .../>` that virDomainSetMetadata takes (with prefix "rift"
    and RIFT_XMLNS). ValueError when `xml` carries no Rift metadata or `task_id`
    holds a character XML cannot carry.
    """
    if _NOT_XML.search(task_id):
        raise ValueError("task_id holds a character XML cannot carry")
    element = _rift_element(xml)
    if element is None:
        raise ValueError("the domain carries no Rift metadata")
    attrs = dict(element.attrib)
    attrs["task"] = task_id
    return ET.tostring(ET.Element("vm", attrs), encoding="unicode")


def domain_xml_with_task(xml: str, task_id: str) -> str:
    """A whole domain XML (as libvirt writes it) with the task id of its Rift
    metadata replaced; every other byte is kept, so libvirt takes it back as the
    same domain (a managed save image's XML must keep its ABI).

    ValueError when the XML carries no single Rift element with a task, or
    `task_id` holds a character XML cannot carry.
    """
    if _NOT_XML.search(task_id):
        raise ValueError("task_id holds a character XML cannot carry")
    before = parse_rift_mark(xml)
    tags = list(_RIFT_TAG.finditer(xml))
    if before[0] is None or len(tags) != 1:
        raise ValueError("the domain XML carries no single Rift metadata element with a task")
    tag = tags[0]
    value = escape(task_id, _ATTR_ESCAPES)
    new_tag, count = _TASK_ATTR.subn(lambda m: f'{m.group(1)}"{value}"', tag.group(0))
    if count != 1:
        raise ValueError("the Rift metadata element has no single task attribute")
    changed = xml[:tag.start()] + new_tag + xml[tag.end():]
    if parse_rift_mark(changed) != (task_id, before[1], before[2]):
        raise ValueError("the Rift metadata element could not be rewritten")
    return changed


def parse_rift_metadata(xml: str) -> tuple[str | None, str | None]:
    """(task id, VM id) from Rift metadata, or (None, None) when there is none."""
    task_id, vm_id, _install = parse_rift_mark(xml)
    return task_id, vm_id


def parse_rift_mark(xml: str) -> tuple[str | None, str | None, str | None]:
    """(task id, VM id, installation) from Rift metadata; Nones when there is none.

    Takes a whole domain XML, or the bare metadata element that libvirt's
    virDomainGetMetadata returns (`<vm task=".." vm=".."/>`, namespace dropped).
    Unreadable XML counts as no metadata: such a domain is never taken for Rift's.
    """
    element = _rift_element(xml)
    if element is None:
        return None, None, None
    return element.get("task"), element.get("vm"), element.get("install")


def _rift_element(xml: str) -> ET.Element | None:
    """The Rift metadata element of a domain XML or a bare one; None when there is none."""
    if "<!DOCTYPE" in xml:
        return None  # no DTD, so no entities: libvirt never writes one
    try:
        # Safe without defusedxml: a DTD (where entities live) is refused above, and
        # ElementTree never fetches external resources.
        root = ET.fromstring(xml)  # noqa: S314
    except ET.ParseError:
        return None
    if root.tag == "domain":
        return root.find(f"metadata/{_RIFT_VM}")
    if root.tag in (_RIFT_VM, "vm"):
        return root
    return None
