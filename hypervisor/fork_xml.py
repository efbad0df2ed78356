"""A fork's domain XML (SPEC §12): the XML of a saved domain, as libvirt wrote it
into the save image, with the fields that tell one fork from another replaced
(`fork_domain_xml`) and every other byte kept; the result is checked before it is
answered. Pure functions over strings; no libvirt here. The save image around it
is `save_image.py`.
"""

from __future__ import annotations

import re
import uuid as uuid_module
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace

from hypervisor.base import VolumeDisk
from hypervisor.domain_xml import QEMU_XMLNS, RIFT_XMLNS, parse_rift_mark

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
# Characters XML 1.0 cannot carry at all, even escaped.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NAME_EL = re.compile(r"(<name>)([^<]*)(</name>)")
_UUID_EL = re.compile(r"(<uuid>)([^<]*)(</uuid>)")
_RIFT_TAG = re.compile(
    r"<(?P<prefix>[A-Za-z_][\w.-]*):vm\s[^>]*xmlns:(?P=prefix)=([\"'])"
    + re.escape(RIFT_XMLNS) + r"\2[^>]*>")
_HOSTFWD = re.compile(r"(hostfwd=tcp:127\.0\.0\.1:)(\d+)(-:22\b)")
_DISK_EL = re.compile(r"<disk\s[^>]*>.*?</disk>", re.DOTALL)
_CHARDEV_EL = re.compile(r"<(?P<tag>serial|console)\s[^>]*\btype=([\"'])file\2[^>]*>.*?</(?P=tag)>",
                         re.DOTALL)
_SOURCE_TAG = re.compile(r"<source\s[^>]*>")
_VOLUME_SERIAL = re.compile(r"<serial>(vol_[a-z2-7]{8})</serial>")
_ATTR = r"""\s{}\s*=\s*(["'])(.*?)\1"""


@dataclass(frozen=True)
class ForkDomain:
    """What tells one fork's domain from another's: its name and UUID, the Rift mark's
    VM and task, its vda disk (None: a domain with no vda file disk), its serial
    log, its SSH port, and its cloud-init seed (vdb; None: a domain without one)."""

    name: str
    uuid: str
    vm_id: str
    task_id: str
    disk: str | None
    serial_log: str
    ssh_port: int
    seed: str | None = None
    install: str | None = None  # the installation the fork is of (None: the saved one's)


def fork_domain_xml(xml: str, fork: ForkDomain) -> str:
    """A domain XML as libvirt writes it (a save image's) with the fields that tell
    one fork from another replaced; every other byte is kept.

    Replaced: `<name>`, `<uuid>`, the `vm` and `task` attributes of the Rift
    metadata element (and its `install`, when the fork names one: a state
    another installation saved, an image's folder shared between data dirs),
    the source file of the vda disk (`disk`; None for a domain
    with no vda file disk) and of the vdb disk (`seed`, a cloud-init seed; None
    for a domain without one), the source path of the file serial port and of the
    console that mirrors it (`serial_log`), and the port of the qemu:arg
    `hostfwd=tcp:127.0.0.1:PORT-:22`. ValueError when one of them is not found
    exactly once (a vda disk present while `disk` is None counts), or a value
    cannot go into a domain XML.
    """
    _check_fork_values(fork)
    name, vm_id, task_id, disk, seed = fork.name, fork.vm_id, fork.task_id, fork.disk, fork.seed
    if seed is not None and (_NOT_XML.search(seed) or not seed.startswith("/")):
        raise ValueError(f"seed must be an absolute path XML can carry, not {seed!r}")
    fork = replace(fork, uuid=str(uuid_module.UUID(fork.uuid)))
    old_rift = parse_rift_mark(xml)
    out = _replace_text(xml, _NAME_EL, name, "<name>")
    out = _replace_text(out, _UUID_EL, fork.uuid, "<uuid>")
    out = _replace_rift(out, vm_id=vm_id, task_id=task_id, install=fork.install)
    out = _replace_disk(out, disk)
    out = _replace_disk(out, seed, "vdb")
    old_serial, out = _replace_serial(out, fork.serial_log)
    out = _replace_port(out, fork.ssh_port)
    _check_fork_result(out, fork, (task_id, vm_id, fork.install or old_rift[2]), old_serial)
    return out


def _check_fork_values(fork: ForkDomain) -> None:
    name, uuid, ssh_port, disk, serial_log = (fork.name, fork.uuid, fork.ssh_port, fork.disk,
                                              fork.serial_log)
    texts = {"vm_id": fork.vm_id, "task_id": fork.task_id, "disk": disk,
             "serial_log": serial_log, "install": fork.install}
    if not _NAME.fullmatch(name):
        raise ValueError(f"domain name {name!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]*")
    try:
        uuid_module.UUID(uuid)
    except ValueError as exc:
        raise ValueError(f"uuid {uuid!r} is not a UUID") from exc
    if not 1 <= ssh_port <= 65535:
        raise ValueError(f"ssh_port {ssh_port} is not a TCP port")
    for field, value in texts.items():
        if value is not None and _NOT_XML.search(value):
            raise ValueError(f"{field} holds a character XML cannot carry")
    for field in ("disk", "serial_log"):
        path = texts[field]
        if path is not None and not path.startswith("/"):
            raise ValueError(f"{field} must be an absolute path, not {path!r}")


def _text(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(value: str, quote: str) -> str:
    """`value` escaped for an attribute value between `quote`s."""
    escaped = _text(value).replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")
    return escaped.replace(quote, "&quot;" if quote == '"' else "&apos;")


def _only(matches: list[re.Match[str]], what: str) -> re.Match[str]:
    if len(matches) != 1:
        raise ValueError(f"the domain XML holds {len(matches)} {what}, not one")
    return matches[0]


def _splice(xml: str, start: int, end: int, new: str) -> str:
    return xml[:start] + new + xml[end:]


def _replace_text(xml: str, element: re.Pattern[str], value: str, what: str) -> str:
    match = _only(list(element.finditer(xml)), what)
    return _splice(xml, match.start(2), match.end(2), _text(value))


def _replace_attr(tag: str, attr: str, value: str, what: str) -> str:
    """`tag` (one start tag) with the value of its attribute `attr` replaced."""
    pattern = re.compile(rf"""(\s{attr}\s*=\s*)(["'])(.*?)\2""", re.DOTALL)
    match = _only(list(pattern.finditer(tag)), f"{attr} attributes in {what}")
    quote = match.group(2)
    return _splice(tag, match.start(), match.end(),
                   f"{match.group(1)}{quote}{_attr(value, quote)}{quote}")


def _replace_rift(xml: str, *, vm_id: str, task_id: str, install: str | None) -> str:
    tag = _only(list(_RIFT_TAG.finditer(xml)), "Rift metadata elements")
    new_tag = _replace_attr(tag.group(0), "vm", vm_id, "the Rift metadata element")
    new_tag = _replace_attr(new_tag, "task", task_id, "the Rift metadata element")
    if install is not None:  # a state saved by another installation (an image's, shared)
        if re.search(r"\sinstall\s*=", new_tag):
            new_tag = _replace_attr(new_tag, "install", install, "the Rift metadata element")
        else:
            space = re.match(r"<[^\s>]+", new_tag)
            assert space is not None  # _RIFT_TAG matched a start tag
            new_tag = _splice(new_tag, space.end(), space.end(),
                              f' install="{_attr(install, chr(34))}"')
    return _splice(xml, tag.start(), tag.end(), new_tag)


def _replace_disk(xml: str, disk: str | None, dev: str = "vda") -> str:
    target = re.compile(r"""<target\s[^>]*\bdev=(["'])""" + dev + r"""\1""")
    found = [m for m in _DISK_EL.finditer(xml) if target.search(m.group(0))]
    if disk is None:
        if found:
            raise ValueError(f"the domain XML has a {dev} disk, and no new one was given")
        return xml
    element = _only(found, f"{dev} disks")
    body = element.group(0)
    if "<backingStore" in body and not re.search(r"<backingStore\s*/>", body):
        # Its chain names the source's files; the fork's is other.
        raise ValueError(f"the {dev} disk lists its backing chain; fork an XML without it")
    source = _only(list(_SOURCE_TAG.finditer(body)), f"sources in the {dev} disk")
    new_source = _replace_attr(source.group(0), "file", disk, f"the {dev} disk's source")
    new_body = _splice(body, source.start(), source.end(), new_source)
    return _splice(xml, element.start(), element.end(), new_body)


def _replace_serial(xml: str, serial_log: str) -> tuple[str | None, str]:
    """(the old serial log path, `xml` with the file serial port's and its
    console's source paths made `serial_log`)."""
    chardevs = list(_CHARDEV_EL.finditer(xml))
    serial = _only([m for m in chardevs if m.group("tag") == "serial"], "file serial ports")
    old_path = _source_path(serial.group(0))
    out = []
    last = 0
    for chardev in chardevs:
        if chardev.group("tag") == "console" and _source_path(chardev.group(0)) != old_path:
            continue  # a console of its own, not the mirror of the serial port
        body = chardev.group(0)
        source = _only(list(_SOURCE_TAG.finditer(body)), f"sources in a file {chardev['tag']}")
        new_source = _replace_attr(source.group(0), "path", serial_log,
                                   f"the file {chardev['tag']}'s source")
        out.append(xml[last:chardev.start()])
        out.append(_splice(body, source.start(), source.end(), new_source))
        last = chardev.end()
    out.append(xml[last:])
    return old_path, "".join(out)


def _source_path(chardev: str) -> str | None:
    source = _SOURCE_TAG.search(chardev)
    if source is None:
        return None
    match = re.search(r"""\spath\s*=\s*(["'])(.*?)\1""", source.group(0), re.DOTALL)
    return None if match is None else match.group(2)


def _replace_port(xml: str, ssh_port: int) -> str:
    match = _only(list(_HOSTFWD.finditer(xml)), "hostfwd=tcp:127.0.0.1:PORT-:22 forwards")
    return _splice(xml, match.start(2), match.end(2), str(ssh_port))


def _check_fork_result(xml: str, fork: ForkDomain,
                       rift: tuple[str | None, str | None, str | None],
                       old_serial: str | None) -> None:
    """Read the rewritten XML back; ValueError when it does not say what was asked
    (`rift`: the mark it should carry; `old_serial`: the serial log it had)."""
    name, uuid, disk, serial_log, ssh_port = (fork.name, fork.uuid, fork.disk, fork.serial_log,
                                              fork.ssh_port)
    if "<!DOCTYPE" in xml:
        raise ValueError("the domain XML carries a DTD")
    try:
        # Safe without defusedxml: no DTD (so no entities), and ElementTree never
        # fetches external resources.
        root = ET.fromstring(xml)  # noqa: S314
    except ET.ParseError as exc:
        raise ValueError(f"the rewritten domain XML does not parse: {exc}") from exc
    found_disks = [d.find("source") for d in root.iterfind("devices/disk")
                   if (t := d.find("target")) is not None and t.get("dev") == "vda"]
    hostfwd = f"hostfwd=tcp:127.0.0.1:{ssh_port}-:22"
    args = [a.get("value", "") for a in root.iterfind(f"{{{QEMU_XMLNS}}}commandline/"
                                                      f"{{{QEMU_XMLNS}}}arg")]
    serials = [s.find("source") for s in root.iterfind("devices/serial")
               if s.get("type") == "file"]
    consoles = [c.find("source") for c in root.iterfind("devices/console")
                if c.get("type") == "file"]
    ok = (
        root.findtext("name") == name
        and (root.findtext("uuid") or "").lower() == uuid
        and parse_rift_mark(xml) == rift
        and (disk is None or [d.get("file") if d is not None else None
                              for d in found_disks] == [disk])
        and [s.get("path") if s is not None else None for s in serials] == [serial_log]
        and (old_serial == serial_log
             or all(c is None or c.get("path") != old_serial for c in consoles))
        and sum(hostfwd in arg for arg in args) == 1
    )
    if not ok:
        raise ValueError("the domain XML could not be rewritten")


def volume_disks(xml: str) -> list[VolumeDisk]:
    """The volumes (SPEC §18) a domain XML holds: each file `<disk>` whose serial is a
    volume id, with its source, target and whether it is read-only. ValueError for
    one without a source file or a target."""
    found = []
    for element in _DISK_EL.finditer(xml):
        body = element.group(0)
        serial = _VOLUME_SERIAL.search(body)
        if serial is None:
            continue
        source = _SOURCE_TAG.search(body)
        path = re.search(_ATTR.format("file"), source.group(0)) if source else None
        target = re.search(r"<target\s[^>]*>", body)
        dev = re.search(_ATTR.format("dev"), target.group(0)) if target else None
        if path is None or dev is None:
            raise ValueError(f"the disk of volume {serial.group(1)} has no source file or target")
        found.append(VolumeDisk(path.group(2), dev.group(2), serial.group(1),
                                re.search(r"<readonly\s*/>", body) is not None))
    return found


def migrated_disks(xml: str, copy_volumes: bool) -> list[str]:
    """The targets of a domain's disks whose blocks a migration carries: its own
    (`vda`), and with `copy_volumes` each writable volume's (a read-only one is put
    there whole before). ValueError as volume_disks'."""
    own = ["vda"] if re.search(r"<target\s+dev=['\"]vda['\"]", xml) else []
    return own + ([d.target for d in volume_disks(xml) if not d.read_only]
                  if copy_volumes else [])


def with_volume_sources(xml: str, sources: dict[str, str]) -> str:
    """`xml` with the source file of the disk of each volume (by serial) in `sources`
    made the path it maps to; every other byte kept. ValueError when one of them is
    not a disk of the XML, or a path is not absolute."""
    out, last = [], 0
    missing = set(sources)
    for element in _DISK_EL.finditer(xml):
        body = element.group(0)
        serial = _VOLUME_SERIAL.search(body)
        if serial is None or serial.group(1) not in sources:
            continue
        new = sources[serial.group(1)]
        if not new.startswith("/") or _NOT_XML.search(new):
            raise ValueError(f"a volume's source must be an absolute path, not {new!r}")
        source = _only(list(_SOURCE_TAG.finditer(body)), "sources in a volume's disk")
        new_source = _replace_attr(source.group(0), "file", new, "a volume disk's source")
        out.append(xml[last:element.start()])
        out.append(_splice(body, source.start(), source.end(), new_source))
        last = element.end()
        missing.discard(serial.group(1))
    if missing:
        raise ValueError(f"the domain XML holds no disk of {sorted(missing)}")
    out.append(xml[last:])
    return "".join(out)
