"""libvirt's QEMU save image (what virDomainSave writes): its header read, and
forks of it written, each a new save file under another domain's XML.

Pure functions over files and strings; no libvirt here. The layout is that of
libvirt 9.0's src/qemu/qemu_saveimage.h and .c (unchanged up to 11.x, where
`compressed` is called `format`), in the host's byte order:

    offset  0  char magic[16]     "LibvirtQemudSave" ("LibvirtQemudPart" while
                                  libvirt is still writing it)
           16  uint32 version     2
           20  uint32 data_len    bytes after the header, padding included
           24  uint32 was_running 1: restore resumes the CPUs
           28  uint32 compressed  0 raw; 1 gzip, 2 bzip2, 3 xz, 4 lzop (and,
                                  in later libvirt, 5 zstd, 6 sparse)
           32  uint32 cookieOffset where the cookie starts, counted from the
                                  end of the header (offset 92); 0: none
           36  uint32 unused[14]
           92  the domain XML, NUL-terminated; the save cookie (`<qemuCookie>`),
               NUL-terminated; zeros to data_len (libvirt pads 64 KiB, so an
               edited XML may grow)
     92 + data_len  QEMU's migration stream, to the end of the file

libvirt restores a save file only as the domain its XML names, and refuses a
replacement XML (virDomainRestoreFlags' dxml) whose name or UUID differ. A
fork is therefore a new file: a new header and XML (`fork_domain_xml`), the
same cookie, and the same stream, copied inside the kernel (copy_file_range,
or sendfile where that is refused) so the guest's memory never passes through
Python. Nothing in the file checks its contents: no checksum covers the XML,
the cookie or the stream.
"""

from __future__ import annotations

import os
import re
import struct
import uuid as uuid_module
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace

from hypervisor.domain_xml import QEMU_XMLNS, RIFT_XMLNS, parse_rift_mark
from hypervisor.host_disk import LOCAL_DISK, HostDisk

MAGIC = b"LibvirtQemudSave"
PARTIAL_MAGIC = b"LibvirtQemudPart"
VERSION = 2
HEADER_BYTES = 92
XML_PADDING = 64 * 1024  # what libvirt leaves after the XML and cookie, for edits
RAW = 0  # the `compressed` value of an uncompressed stream

_FIELDS = "16s5I56s"  # magic, version .. cookieOffset, unused[14] (kept as it is)

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


@dataclass(frozen=True)
class SaveImage:
    """What the header of one save file says."""

    version: int
    xml: str  # the domain XML the restore runs, without its NUL
    cookie: bytes  # libvirt's save cookie without its NUL; b"" when there is none
    stream_offset: int  # where QEMU's migration stream starts: 92 + data_len
    was_running: bool
    compressed: int  # RAW (0), or the compressor's number
    data_len: int  # the XML, cookie and padding after the header


@dataclass(frozen=True)
class _Header:
    image: SaveImage
    order: str  # struct byte order of the file: "<" or ">"
    has_cookie: bool
    unused: bytes


FORK_PREFIX = ".fork-"  # each fork's own copy of a saved state, beside it while it restores


def fork_copy_path(state_path: str, domain_name: str) -> str:
    """Where a fork's copy of the saved state at `state_path` is written (and
    removed once libvirt restored it); a crash between leaves it for the sweep,
    which removes such copies once they are older than any restore takes."""
    return os.path.join(os.path.dirname(state_path), f"{FORK_PREFIX}{domain_name}.save")


def read_save_header(path: str | os.PathLike[str], disk: HostDisk = LOCAL_DISK) -> SaveImage:
    """The header, XML and cookie of the save file at `path` (on `disk`: this
    machine's, or a host's elsewhere).

    ValueError when it is not a complete libvirt QEMU save image (wrong magic,
    one libvirt did not finish, another version, or a file cut short before its
    stream); a stream cut short inside cannot be told from the header. OSError
    when it cannot be read.
    """
    return _read_header(disk, str(path)).image


def _read_header(disk: HostDisk, path: str) -> _Header:
    raw = disk.read_at(path, 0, HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{path}: too short for a save image header "
                         f"({len(raw)} of {HEADER_BYTES} bytes)")
    magic = raw[:16]
    if magic == PARTIAL_MAGIC:
        raise ValueError(f"{path}: an incomplete save image (libvirt did not finish it)")
    if magic != MAGIC:
        raise ValueError(f"{path}: not a libvirt QEMU save image (magic {magic!r})")
    order = "<"
    fields = struct.unpack(order + _FIELDS, raw)
    if fields[1] > VERSION:  # written on a host of the other byte order, as libvirt reads it
        order = ">"
        fields = struct.unpack(order + _FIELDS, raw)
    _magic, version, data_len, was_running, compressed, cookie_offset, unused = fields
    if version != VERSION:
        raise ValueError(f"{path}: save image version {version}; only {VERSION} is understood")
    if data_len == 0 or cookie_offset > data_len:
        raise ValueError(f"{path}: bad header (data_len {data_len}, "
                         f"cookieOffset {cookie_offset})")
    size = disk.size(path)
    if size < HEADER_BYTES + data_len:
        raise ValueError(f"{path}: cut short inside its domain XML "
                         f"({size - HEADER_BYTES} of {data_len} bytes)")
    data = disk.read_at(path, HEADER_BYTES, data_len)
    if len(data) < data_len:
        raise ValueError(f"{path}: cut short while it was read")
    xml_part = data[:cookie_offset] if cookie_offset else data
    xml_bytes, nul, _rest = xml_part.partition(b"\0")
    if not nul:
        raise ValueError(f"{path}: its domain XML is not NUL-terminated")
    cookie = data[cookie_offset:].partition(b"\0")[0] if cookie_offset else b""
    try:
        xml = xml_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: its domain XML is not UTF-8 ({exc})") from exc
    stream_offset = HEADER_BYTES + data_len
    if size <= stream_offset:
        raise ValueError(f"{path}: cut short: no migration stream after its domain XML")
    image = SaveImage(version=version, xml=xml, cookie=cookie, stream_offset=stream_offset,
                      was_running=bool(was_running), compressed=compressed, data_len=data_len)
    return _Header(image=image, order=order, has_cookie=cookie_offset != 0,
                   unused=unused)


def write_fork(src_path: str | os.PathLike[str], dst_path: str | os.PathLike[str],
               xml: str, disk: HostDisk = LOCAL_DISK) -> None:
    """Write at `dst_path` a save file that restores as the domain `xml` describes,
    from the cookie and migration stream of the save file at `src_path` (both on
    `disk`: this machine's, or a host's elsewhere, where the stream is copied).

    The header keeps the source's version, byte order and was_running; the
    padding keeps its size when the new XML fits in it (so the stream stays at
    the same offset), and is 64 KiB past the new XML and cookie when it does not.
    The file is written beside `dst_path` under a temporary name (mode 0600: it
    holds the guest's memory) and renamed onto it when complete; an existing
    `dst_path` is replaced. ValueError when the source is not a raw (uncompressed)
    save image or `xml` holds a NUL; OSError when a file cannot be read or written.
    """
    if "\0" in xml:
        raise ValueError("the domain XML holds a NUL")
    header = _read_header(disk, str(src_path))
    image = header.image
    if image.compressed != RAW:
        raise ValueError(f"{src_path}: its stream is compressed (format "
                         f"{image.compressed}); only raw save images can be forked")
    xml_bytes = xml.encode("utf-8") + b"\0"
    cookie = image.cookie + b"\0" if header.has_cookie else b""
    used = len(xml_bytes) + len(cookie)
    data_len = image.data_len if used <= image.data_len else used + XML_PADDING
    head = struct.pack(header.order + _FIELDS, MAGIC, image.version, data_len,
                       int(image.was_running), image.compressed,
                       len(xml_bytes) if cookie else 0, header.unused)
    disk.spliced(str(src_path), head + xml_bytes + cookie + bytes(data_len - used),
                 image.stream_offset, str(dst_path))


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


def fork_domain_xml(xml: str, fork: ForkDomain) -> str:
    """A domain XML as libvirt writes it (a save image's) with the fields that tell
    one fork from another replaced; every other byte is kept.

    Replaced: `<name>`, `<uuid>`, the `vm` and `task` attributes of the Rift
    metadata element, the source file of the vda disk (`disk`; None for a domain
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
    out = _replace_rift(out, vm_id=vm_id, task_id=task_id)
    out = _replace_disk(out, disk)
    out = _replace_disk(out, seed, "vdb")
    old_serial, out = _replace_serial(out, fork.serial_log)
    out = _replace_port(out, fork.ssh_port)
    _check_fork_result(out, fork, (task_id, vm_id, old_rift[2]), old_serial)
    return out


def _check_fork_values(fork: ForkDomain) -> None:
    name, uuid, ssh_port, disk, serial_log = (fork.name, fork.uuid, fork.ssh_port, fork.disk,
                                              fork.serial_log)
    texts = {"vm_id": fork.vm_id, "task_id": fork.task_id, "disk": disk,
             "serial_log": serial_log}
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


def _replace_rift(xml: str, *, vm_id: str, task_id: str) -> str:
    tag = _only(list(_RIFT_TAG.finditer(xml)), "Rift metadata elements")
    new_tag = _replace_attr(tag.group(0), "vm", vm_id, "the Rift metadata element")
    new_tag = _replace_attr(new_tag, "task", task_id, "the Rift metadata element")
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
