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
fork is therefore a new file: a new header and XML (`fork_xml.py`), the
same cookie, and the same stream, copied inside the kernel (copy_file_range,
or sendfile where that is refused) so the guest's memory never passes through
Python. Nothing in the file checks its contents: no checksum covers the XML,
the cookie or the stream.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from hypervisor.host_disk import LOCAL_DISK, HostDisk

MAGIC = b"LibvirtQemudSave"
PARTIAL_MAGIC = b"LibvirtQemudPart"
VERSION = 2
HEADER_BYTES = 92
XML_PADDING = 64 * 1024  # what libvirt leaves after the XML and cookie, for edits
RAW = 0  # the `compressed` value of an uncompressed stream

_FIELDS = "16s5I56s"  # magic, version .. cookieOffset, unused[14] (kept as it is)


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


def stand_in_path(volume_path: str, domain_name: str, target: str) -> str:
    """Where a fork's stand-in for a writable volume's disk goes (hypervisor.volumes.
    make_stand_in): beside the volume's file, in a folder QEMU may pass through (the
    snapshot's folder is Rift's alone: QEMU, as its own user, was refused there)."""
    return os.path.join(os.path.dirname(volume_path), f".stand-in-{domain_name}-{target}.qcow2")


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
