"""The pure parts of real guests: the initramfs archive, module order, image
manifests, the kernel command line, the TCG domain, serial markers, and the
accelerator verdict's cache."""

from __future__ import annotations

import base64
import json
import stat
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hypervisor.base import GuestDomain, ImageError
from hypervisor.cloud_kernel import module_order
from hypervisor.cpio import Archive
from hypervisor.domain_xml import build_domain_xml, tcg_tb_cache_mib
from hypervisor.image_files import ImageFiles, image_files
from hypervisor.kernel_boot import guest_cmdline, guest_spec
from hypervisor.kvm import TCG, _read_cache, _write_cache, probe_accel
from hypervisor.tiny import MODULE_ROOTS
from rift.guest.errors import GuestError
from rift.guest.ready import read_markers, wait_for_marker


def parse_newc(data: bytes) -> dict[str, tuple[int, bytes, int, int]]:
    """name -> (mode, data, rdev major, rdev minor) of a newc archive."""
    entries: dict[str, tuple[int, bytes, int, int]] = {}
    offset = 0
    while True:
        header = data[offset:offset + 110]
        assert header[:6] == b"070701"
        fields = [int(header[6 + 8 * i:14 + 8 * i], 16) for i in range(13)]
        mode, size, rmajor, rminor, namesize = (fields[1], fields[6], fields[9], fields[10],
                                                fields[11])
        assert fields[2] == fields[3] == 0  # owned by root
        name_end = offset + 110 + namesize
        name = data[offset + 110:name_end - 1].decode()
        start = name_end + (-name_end % 4)
        body = data[start:start + size]
        offset = start + size + (-(start + size) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = (mode, body, rmajor, rminor)


def test_the_archive_holds_files_links_folders_and_devices_owned_by_root() -> None:
    archive = Archive()
    archive.file("init", b"#!/bin/sh\n", 0o755)
    archive.symlink("bin/sh", "/bin/busybox")
    archive.directory("root", 0o700)
    archive.char_device("dev/console", 5, 1)
    entries = parse_newc(archive.finish())
    assert entries["init"][1] == b"#!/bin/sh\n" and stat.S_IMODE(entries["init"][0]) == 0o755
    assert stat.S_ISLNK(entries["bin/sh"][0]) and entries["bin/sh"][1] == b"/bin/busybox"
    assert stat.S_ISDIR(entries["bin"][0])  # parents are made
    assert stat.S_IMODE(entries["root"][0]) == 0o700
    mode, _, major, minor = entries["dev/console"]
    assert stat.S_ISCHR(mode) and (major, minor) == (5, 1)


def test_the_archive_lists_parents_before_children_and_is_reproducible() -> None:
    def make() -> bytes:
        archive = Archive()
        archive.file("a/b/c", b"x")
        archive.file("a-b", b"y")
        return archive.finish()

    assert make() == make()
    names = list(parse_newc(make()))
    assert names.index("a") < names.index("a/b") < names.index("a/b/c")


def _module(root: Path, rel: str, depends: str) -> None:
    path = root / "kernel" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF junk\x00license=GPL\x00depends=" + depends.encode() + b"\x00x")


def test_modules_load_after_what_they_depend_on_and_built_ins_are_skipped(tmp_path: Path) -> None:
    _module(tmp_path, "drivers/virtio/virtio_ring.ko", "")
    _module(tmp_path, "drivers/virtio/virtio.ko", "virtio_ring")
    _module(tmp_path, "drivers/virtio/virtio_pci_modern_dev.ko", "")
    _module(tmp_path, "drivers/virtio/virtio_pci.ko", "virtio_ring,virtio_pci_modern_dev,virtio")
    _module(tmp_path, "net/core/failover.ko", "")
    _module(tmp_path, "drivers/net/net_failover.ko", "failover")
    _module(tmp_path, "drivers/net/virtio_net.ko", "virtio_ring,virtio,net_failover")
    _module(tmp_path, "drivers/char/hw_random/virtio-rng.ko", "virtio,virtio_ring")
    _module(tmp_path, "drivers/block/virtio_blk.ko", "virtio,virtio_ring")
    (tmp_path / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci_modern_dev.ko\n")
    order = [name for name, _ in module_order(tmp_path, MODULE_ROOTS)]
    assert sorted(order) == sorted(["virtio_ring", "virtio", "virtio_pci", "failover",
                                    "net_failover", "virtio_net", "virtio_rng", "virtio_blk"])
    for before, after in [("virtio_ring", "virtio"), ("virtio", "virtio_pci"),
                          ("failover", "net_failover"), ("net_failover", "virtio_net"),
                          ("virtio", "virtio_rng"), ("virtio", "virtio_blk")]:
        assert order.index(before) < order.index(after)


def test_a_missing_module_is_named(tmp_path: Path) -> None:
    _module(tmp_path, "drivers/virtio/virtio_pci.ko", "virtio_ring")
    with pytest.raises(ImageError, match="virtio_ring"):
        module_order(tmp_path, MODULE_ROOTS)


def _manifest(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "vmlinux").write_bytes(b"k")
    (folder / "initrd.img").write_bytes(b"i")
    (folder / "manifest.json").write_text(json.dumps({
        "kernel": {"file": "vmlinux"}, "initrd": {"file": "initrd.img"},
        "cmdline_base": "console=ttyS0 quiet"}))


def test_a_built_image_is_found_through_its_manifest(tmp_path: Path) -> None:
    _manifest(tmp_path / "tiny")
    files = image_files(tmp_path, "tiny")
    assert files.kernel == (tmp_path / "tiny" / "vmlinux").resolve()
    assert files.initrd.name == "initrd.img" and files.cmdline_base == "console=ttyS0 quiet"


def test_an_image_not_built_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="rift image build tiny"):
        image_files(tmp_path, "tiny")
    _manifest(tmp_path / "tiny")
    (tmp_path / "tiny" / "initrd.img").unlink()
    with pytest.raises(ImageError, match=r"initrd\.img"):
        image_files(tmp_path, "tiny")


IMAGE = ImageFiles("tiny", Path("/img/tiny/vmlinux"), Path("/img/tiny/initrd.img"),
                   "console=ttyS0 quiet")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDDPXh6V0 rift"


def test_the_key_rides_on_the_kernel_command_line_as_one_word() -> None:
    cmdline = guest_cmdline(IMAGE, KEY + "\n")
    base, _, word = cmdline.rpartition(" ")
    assert base == "console=ttyS0 quiet" and word.startswith("rift.key=")
    assert base64.b64decode(word.removeprefix("rift.key=")).decode() == KEY


def test_a_tcg_guests_translation_cache_is_half_its_memory_within_32_and_256_mib() -> None:
    assert [tcg_tb_cache_mib(m) for m in (64, 128, 256, 512, 4096)] == [32, 64, 128, 256, 256]


def test_a_tcg_guest_gets_a_translation_cache_of_its_size_and_a_forwarded_port() -> None:
    spec = guest_spec(IMAGE, _domain("qemu"), KEY)
    root = ET.fromstring(build_domain_xml(spec))  # noqa: S314 - our own output
    assert root.findtext("features/tcg/tb-cache") == "128"  # half of 256 MiB
    assert root.findtext("os/kernel") == "/img/tiny/vmlinux"
    assert "rift.key=" in (root.findtext("os/cmdline") or "")
    kvm = ET.fromstring(build_domain_xml(  # noqa: S314
        guest_spec(IMAGE, _domain("kvm"), KEY)))
    assert kvm.find("features/tcg") is None


def test_markers_on_the_serial_log_say_ready_host_key_and_failure(tmp_path: Path) -> None:
    log = tmp_path / "serial.log"
    assert read_markers(log) == (False, None, None)
    log.write_text("noise\r\nRIFT-INIT\r\nRIFT-HOSTKEY ssh-ed25519 AAAA root@rift\r\n")
    assert read_markers(log) == (False, "ssh-ed25519 AAAA root@rift", None)
    log.write_text(log.read_text() + "RIFT-READY\r\n")
    assert read_markers(log)[0]
    assert wait_for_marker(log, time.monotonic() + 1) == "ssh-ed25519 AAAA root@rift"


def test_waiting_for_a_marker_ends_at_a_failure_or_the_deadline(tmp_path: Path) -> None:
    log = tmp_path / "serial.log"
    log.write_text("RIFT-INIT\nRIFT-FAILED no eth0\n")
    with pytest.raises(GuestError, match="no eth0"):
        wait_for_marker(log, time.monotonic() + 5)
    log.write_text("Booting the kernel\n")
    with pytest.raises(GuestError, match="Booting the kernel"):
        wait_for_marker(log, time.monotonic() + 0.1)


def test_an_accelerator_verdict_is_cached_per_key(tmp_path: Path) -> None:
    cache = tmp_path / "accel.json"
    key = {"uri": "qemu:///system", "host_kernel": "6.1", "qemu": "7.2", "guest_kernel": "k"}
    assert _read_cache(cache, key) is None
    _write_cache(cache, key, (TCG, "KVM failed"))
    assert _read_cache(cache, key) == (TCG, "KVM failed")
    assert _read_cache(cache, {**key, "qemu": "8.0"}) is None
    cache.write_text("not json")
    assert _read_cache(cache, key) is None


def test_a_remote_host_is_not_probed() -> None:
    accel, why = probe_accel(IMAGE, "qemu+ssh://far/system")
    assert accel == TCG and "not local" in why


def _domain(domain_type: str) -> GuestDomain:
    return GuestDomain(name="rift-vm_a", task_id="task_a", vm_id="vm_a", vcpus=1,
                       memory_mib=256, domain_type=domain_type, ssh_port=40022,
                       serial_log=Path("/var/serial/vm_a.log"))
