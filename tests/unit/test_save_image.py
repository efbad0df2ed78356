"""libvirt QEMU save images read and forked: synthetic files, headers built by hand."""

from __future__ import annotations

import errno
import os
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hypervisor.domain_xml import QEMU_XMLNS, parse_rift_mark
from hypervisor.save_image import HEADER_BYTES, XML_PADDING, read_save_header, write_fork
from tests.support.saved_xml import NEW_UUID, SAVED_XML, fork

MAGIC = b"LibvirtQemudSave"
COOKIE = (b"<cookie>\n  <cpu mode='custom' match='exact' check='full'/>\n"
          b"  <slirpHelper/>\n</cookie>\n")
STREAM = b"QEVM\x00\x00\x00\x03" + bytes(range(256)) * 64 + b"\x00" * 5000 + b"end-of-stream"

def header(*, data_len: int, cookie_offset: int, magic: bytes = MAGIC, version: int = 2,
           was_running: int = 1, compressed: int = 0, order: str = "<") -> bytes:
    raw = struct.pack(f"{order}16sIIIII14I", magic, version, data_len, was_running, compressed,
                      cookie_offset, *([0] * 14))
    assert len(raw) == HEADER_BYTES
    return raw


def make_image(path: Path, xml: str = SAVED_XML, *, cookie: bytes | None = COOKIE,
               stream: bytes = STREAM, padding: int = XML_PADDING, magic: bytes = MAGIC,
               version: int = 2, was_running: int = 1, compressed: int = 0,
               order: str = "<") -> Path:
    """A save file laid out as libvirt's virQEMUSaveDataWrite lays it out."""
    xml_bytes = xml.encode() + b"\0"
    cookie_bytes = b"" if cookie is None else cookie + b"\0"
    data_len = len(xml_bytes) + len(cookie_bytes) + padding
    head = header(data_len=data_len, cookie_offset=len(xml_bytes) if cookie is not None else 0,
                  magic=magic, version=version, was_running=was_running,
                  compressed=compressed, order=order)
    path.write_bytes(head + xml_bytes + cookie_bytes + bytes(padding) + stream)
    return path


def fields_of(path: Path) -> tuple[int, ...]:
    data = path.read_bytes()
    return struct.unpack("<IIIII", data[16:36])


# --- reading -----------------------------------------------------------------


def test_reads_a_header(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save")
    image = read_save_header(src)
    data_len = len(SAVED_XML) + 1 + len(COOKIE) + 1 + XML_PADDING
    assert image.version == 2
    assert image.xml == SAVED_XML
    assert image.cookie == COOKIE
    assert image.was_running is True
    assert image.compressed == 0
    assert image.data_len == data_len
    assert image.stream_offset == HEADER_BYTES + data_len
    assert src.read_bytes()[image.stream_offset:] == STREAM


def test_reads_an_image_without_cookie_or_padding(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save", cookie=None, padding=0, was_running=0)
    image = read_save_header(src)
    assert image.xml == SAVED_XML
    assert image.cookie == b""
    assert image.was_running is False
    assert image.stream_offset == HEADER_BYTES + len(SAVED_XML) + 1


def test_reads_a_big_endian_header(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save", order=">")
    image = read_save_header(src)
    assert (image.version, image.xml, image.cookie) == (2, SAVED_XML, COOKIE)
    assert src.read_bytes()[image.stream_offset:] == STREAM


@pytest.mark.parametrize(("magic", "words"), [
    (b"LibvirtQemudPart", "incomplete"),
    (b"NotASaveImage!!!", "not a libvirt QEMU save image"),
    (b"QEVM\x00\x00\x00\x03" * 2, "not a libvirt QEMU save image"),
])
def test_refuses_a_bad_magic(tmp_path: Path, magic: bytes, words: str) -> None:
    src = make_image(tmp_path / "a.save", magic=magic)
    with pytest.raises(ValueError, match=words):
        read_save_header(src)


def test_refuses_another_version(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="version 1"):
        read_save_header(make_image(tmp_path / "a.save", version=1))


@pytest.mark.parametrize(("keep", "words"), [
    (0, "too short"),
    (40, "too short"),
    (HEADER_BYTES + 100, "cut short inside its domain XML"),
    (HEADER_BYTES + len(SAVED_XML) + 1 + len(COOKIE) + 1 + XML_PADDING, "no migration stream"),
])
def test_refuses_a_truncated_file(tmp_path: Path, keep: int, words: str) -> None:
    src = make_image(tmp_path / "a.save")
    src.write_bytes(src.read_bytes()[:keep])
    with pytest.raises(ValueError, match=words):
        read_save_header(src)


def test_refuses_an_unterminated_xml_and_a_bad_header(tmp_path: Path) -> None:
    xml = SAVED_XML.encode()
    bad = tmp_path / "a.save"
    bad.write_bytes(header(data_len=len(xml) + 4, cookie_offset=len(xml)) + xml + b"ck\0\0"
                    + STREAM)
    with pytest.raises(ValueError, match="not NUL-terminated"):
        read_save_header(bad)
    bad.write_bytes(header(data_len=10, cookie_offset=20) + bytes(10) + STREAM)
    with pytest.raises(ValueError, match="bad header"):
        read_save_header(bad)
    bad.write_bytes(header(data_len=0, cookie_offset=0) + STREAM)
    with pytest.raises(ValueError, match="bad header"):
        read_save_header(bad)


# --- writing forks -----------------------------------------------------------


def test_the_same_xml_writes_the_same_file(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save")
    dst = tmp_path / "b.save"
    write_fork(src, dst, read_save_header(src).xml)
    assert dst.read_bytes() == src.read_bytes()
    assert os.stat(dst).st_mode & 0o777 == 0o600


def test_a_longer_xml_that_fits_keeps_the_stream_where_it_was(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save")
    before = read_save_header(src)
    longer = fork()
    longer = longer.replace("</domain>", "<!-- " + "x" * 1000 + " -->\n</domain>")
    assert len(longer) > len(SAVED_XML)
    dst = tmp_path / "b.save"
    write_fork(src, dst, longer)
    after = read_save_header(dst)
    assert after.xml == longer
    assert after.cookie == COOKIE
    assert (after.data_len, after.stream_offset) == (before.data_len, before.stream_offset)
    assert (after.version, after.was_running, after.compressed) == (2, True, 0)
    assert dst.read_bytes()[after.stream_offset:] == STREAM
    assert fields_of(dst)[4] == len(longer.encode()) + 1  # cookieOffset: after the XML's NUL


def test_a_shorter_xml_leaves_only_zeros_behind_the_cookie(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save")
    before = read_save_header(src)
    shorter = SAVED_XML.replace("    <memballoon model='none'/>\n", "")
    dst = tmp_path / "b.save"
    write_fork(src, dst, shorter)
    after = read_save_header(dst)
    assert after.xml == shorter
    assert after.cookie == COOKIE
    assert after.stream_offset == before.stream_offset
    data = dst.read_bytes()
    used = HEADER_BYTES + len(shorter) + 1 + len(COOKIE) + 1
    assert data[used:after.stream_offset] == bytes(after.stream_offset - used)
    assert data[after.stream_offset:] == STREAM


def test_an_xml_past_the_padding_grows_it(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save", padding=16)
    huge = SAVED_XML.replace("</domain>", "<!-- " + "y" * 5000 + " -->\n</domain>")
    dst = tmp_path / "b.save"
    write_fork(src, dst, huge)
    after = read_save_header(dst)
    assert after.xml == huge
    assert after.cookie == COOKIE
    assert after.data_len == len(huge) + 1 + len(COOKIE) + 1 + XML_PADDING
    assert dst.read_bytes()[after.stream_offset:] == STREAM


def test_an_image_without_cookie_forks_without_one(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save", cookie=None)
    dst = tmp_path / "b.save"
    write_fork(src, dst, "<domain/>")
    after = read_save_header(dst)
    assert (after.xml, after.cookie) == ("<domain/>", b"")
    assert fields_of(dst)[4] == 0
    assert dst.read_bytes()[after.stream_offset:] == STREAM


def test_a_big_endian_image_forks_big_endian(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save", order=">")
    dst = tmp_path / "b.save"
    write_fork(src, dst, SAVED_XML)
    assert dst.read_bytes() == src.read_bytes()


def test_refuses_a_compressed_image_and_leaves_nothing(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save", compressed=1)
    assert read_save_header(src).compressed == 1
    with pytest.raises(ValueError, match="compressed"):
        write_fork(src, tmp_path / "b.save", SAVED_XML)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.save"]


@pytest.mark.parametrize("keep", [50, HEADER_BYTES + 10])
def test_refuses_a_truncated_source_and_leaves_nothing(tmp_path: Path, keep: int) -> None:
    src = make_image(tmp_path / "a.save")
    src.write_bytes(src.read_bytes()[:keep])
    with pytest.raises(ValueError, match="short"):
        write_fork(src, tmp_path / "b.save", SAVED_XML)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.save"]


def test_refuses_a_nul_in_the_xml(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save")
    with pytest.raises(ValueError, match="NUL"):
        write_fork(src, tmp_path / "b.save", "<domain>\0</domain>")


def test_replaces_an_existing_file_through_a_temporary_one(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save")
    dst = tmp_path / "b.save"
    dst.write_bytes(b"old")
    write_fork(src, dst, SAVED_XML)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.save", "b.save"]


def test_copies_with_sendfile_when_copy_file_range_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = os.urandom(3 << 20)
    src = make_image(tmp_path / "a.save", stream=stream)

    def refused(*_args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refused)
    dst = tmp_path / "b.save"
    write_fork(src, dst, SAVED_XML)
    assert dst.read_bytes() == src.read_bytes()


def test_a_failed_copy_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_image(tmp_path / "a.save")

    def broken(*_args: object) -> int:
        raise OSError(errno.EIO, "disk on fire")

    monkeypatch.setattr(os, "copy_file_range", broken)
    with pytest.raises(OSError, match="disk on fire"):
        write_fork(src, tmp_path / "b.save", SAVED_XML)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.save"]


# --- rewriting the XML -------------------------------------------------------


def test_fork_xml_changes_only_the_fork_fields() -> None:
    out = fork()
    changed = [(a, b) for a, b in zip(SAVED_XML.splitlines(), out.splitlines(), strict=True)
               if a != b]
    assert [b.strip() for _a, b in changed] == [
        "<name>rift-vm_fork0001</name>",
        f"<uuid>{NEW_UUID}</uuid>",
        '<rift:vm xmlns:rift="https://rift.dev/xmlns/domain/1" task="task_new" '
        'vm="vm_fork0001" image="tiny" install="inst_1"/>',
        "<source file='/var/lib/rift/disks/vm_fork0001.qcow2'/>",
        "<source path='/var/lib/rift/serial/vm_fork0001.log'/>",
        "<source path='/var/lib/rift/serial/vm_fork0001.log'/>",
        "<qemu:arg value='user,id=n0,hostfwd=tcp:127.0.0.1:41234-:22'/>",
    ]
    assert parse_rift_mark(out) == ("task_new", "vm_fork0001", "inst_1")


def test_fork_xml_of_another_installations_state_names_the_forks() -> None:
    # An image's saved state made by another data dir's control plane (a cached
    # image linked into this one): its forks are this installation's domains.
    out = fork(install="inst_2")
    assert parse_rift_mark(out) == ("task_new", "vm_fork0001", "inst_2")
    assert fork(install="inst_2").replace("inst_2", "inst_1") == fork()
    unmarked = SAVED_XML.replace(' install="inst_1"', "")
    assert parse_rift_mark(fork(unmarked)) == ("task_new", "vm_fork0001", None)
    assert parse_rift_mark(fork(unmarked, install="inst_2")) == (
        "task_new", "vm_fork0001", "inst_2")


def test_fork_xml_escapes_values() -> None:
    odd = {"task_id": "t&<'\">", "disk": "/d/a'b&c.qcow2", "serial_log": '/s/"q".log'}
    out = fork(**odd)
    root = ET.fromstring(out)  # noqa: S314 - our own output, no DTD
    assert parse_rift_mark(out)[0] == "t&<'\">"
    assert [e.get("file") for e in root.iterfind("devices/disk/source")] == ["/d/a'b&c.qcow2"]
    assert [e.get("path") for e in root.iterfind("devices/serial/source")] == ['/s/"q".log']
    assert [e.get("path") for e in root.iterfind("devices/console/source")] == ['/s/"q".log']
    args = [a.get("value") for a in root.iter(f"{{{QEMU_XMLNS}}}arg")]
    assert "user,id=n0,hostfwd=tcp:127.0.0.1:41234-:22" in args


def test_fork_xml_upper_case_uuid_is_written_canonical() -> None:
    out = fork(uuid=NEW_UUID.upper())
    assert f"<uuid>{NEW_UUID}</uuid>" in out


def test_fork_xml_without_a_disk() -> None:
    start = SAVED_XML.index("    <disk ")
    end = SAVED_XML.index("</disk>\n") + len("</disk>\n")
    diskless = SAVED_XML[:start] + SAVED_XML[end:]
    out = fork(diskless, disk=None)
    assert "<disk" not in out
    with pytest.raises(ValueError, match="vda disk"):
        fork(disk=None)
    with pytest.raises(ValueError, match="0 vda disks"):
        fork(diskless)


def test_fork_xml_keeps_a_console_of_its_own() -> None:
    own = SAVED_XML.replace(
        "    <console type='file'>\n      <source path='/var/lib/rift/serial/vm_k3v9x2m7.log'/>",
        "    <console type='file'>\n      <source path='/var/log/other.log'/>")
    out = fork(own)
    assert "<source path='/var/log/other.log'/>" in out


@pytest.mark.parametrize(("edit", "words"), [
    (("  <uuid>9d02cac4-44c3-4295-8424-3df2a8960315</uuid>\n", ""), "0 <uuid>"),
    (("  <name>rift-vm_k3v9x2m7</name>\n",
      "  <name>rift-vm_k3v9x2m7</name>\n  <name>again</name>\n"), "2 <name>"),
    (("task=\"task_old\" ", ""), "task attributes"),
    (("xmlns:rift=\"https://rift.dev/xmlns/domain/1\"", "xmlns:rift=\"urn:other\""),
     "0 Rift metadata"),
    (("hostfwd=tcp:127.0.0.1:40022-:22", "hostfwd=tcp::40022-:22"), "hostfwd"),
    (("<serial type='file'>", "<serial type='pty'>"), "0 file serial ports"),
    (("<source file='/var/lib/rift/disks/vm_k3v9x2m7.qcow2'/>", ""), "0 sources in the vda"),
    (("<target dev='vda' bus='virtio'/>",
      "<target dev='vda' bus='virtio'/>\n      <backingStore type='file'>"
      "<source file='/base.qcow2'/></backingStore>"), "backing chain"),
])
def test_fork_xml_refuses_a_field_not_found_exactly_once(edit: tuple[str, str],
                                                         words: str) -> None:
    old, new = edit
    assert old in SAVED_XML
    with pytest.raises(ValueError, match=words):
        fork(SAVED_XML.replace(old, new, 1))


@pytest.mark.parametrize(("field", "value", "words"), [
    ("name", "bad name", "domain name"),
    ("uuid", "not-a-uuid", "not a UUID"),
    ("ssh_port", 0, "TCP port"),
    ("ssh_port", 70000, "TCP port"),
    ("disk", "relative.qcow2", "absolute"),
    ("serial_log", "log.txt", "absolute"),
    ("task_id", "bad\x01", "XML cannot carry"),
])
def test_fork_xml_refuses_bad_values(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        fork(SAVED_XML, **{field: value})


def test_a_forked_xml_round_trips_through_a_save_file(tmp_path: Path) -> None:
    src = make_image(tmp_path / "a.save")
    forked = fork(read_save_header(src).xml)
    dst = tmp_path / "b.save"
    write_fork(src, dst, forked)
    image = read_save_header(dst)
    assert image.xml == forked
    assert ET.fromstring(image.xml).findtext("name") == "rift-vm_fork0001"  # noqa: S314
    assert dst.read_bytes()[image.stream_offset:] == STREAM


def test_fork_xml_gives_a_cloud_init_seed_its_own_file() -> None:
    seeded = SAVED_XML.replace(
        "    <serial ",
        "    <disk type='file' device='disk'>\n"
        "      <driver name='qemu' type='raw'/>\n"
        "      <source file='/var/lib/rift/disks/vm_source01-seed.iso'/>\n"
        "      <target dev='vdb' bus='virtio'/>\n"
        "      <readonly/>\n"
        "    </disk>\n    <serial ", 1)
    out = fork(seeded, seed="/var/lib/rift/disks/vm_fork0001-seed.iso")
    root = ET.fromstring(out)  # noqa: S314 - our own output, no DTD
    sources = {d.find("target").get("dev"): d.find("source").get("file")  # type: ignore[union-attr]
               for d in root.iterfind("devices/disk")}
    assert sources == {"vda": "/var/lib/rift/disks/vm_fork0001.qcow2",
                       "vdb": "/var/lib/rift/disks/vm_fork0001-seed.iso"}
    with pytest.raises(ValueError, match="vdb disk"):
        fork(seeded)  # a seed the fork would share with its source
    with pytest.raises(ValueError, match="seed"):
        fork(seeded, seed="relative.iso")
