"""The parts of the `debian` image that need no guest: its initramfs (modules in
load order, Rift's init), its manifest read back, the kernel command line that
carries the task's key, the plan of a VM (its own sparse overlay of the read-only
base disk as vda, removed with the VM), and the root's set-up on a linked copy."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hypervisor.debian import MODULE_ROOTS, initramfs
from hypervisor.debian_root import PACKAGES, linked_copy, set_up
from hypervisor.domain_xml import build_domain_xml
from hypervisor.image_files import image_files
from hypervisor.kernel_boot import guest_cmdline
from rift.catalog import BUILTIN
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.model import Vm
from rift.guest.adapter import ssh_guests
from rift.services.context import Deps, GuestRuntime
from rift.services.lifecycle import tasks, vms
from rift.services.lifecycle.guest_kinds import KernelGuest, VmFiles
from rift.services.lifecycle.guest_kinds.real import DEFAULT_DISK_GIB, GIB
from tests.support.engine import ALICE

needs_qemu_img = pytest.mark.skipif(shutil.which("qemu-img") is None,
                                    reason="qemu-img is not installed (scripts/libvirt.sh)")


def _newc_names(data: bytes) -> dict[str, tuple[int, bytes]]:
    entries: dict[str, tuple[int, bytes]] = {}
    offset = 0
    while True:
        header = data[offset:offset + 110]
        fields = [int(header[6 + 8 * i:14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name_end = offset + 110 + namesize
        name = data[offset + 110:name_end - 1].decode()
        start = name_end + (-name_end % 4)
        body = data[start:start + size]
        offset = start + size + (-(start + size) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = (mode, body)


def _image(images: Path, disk: bool = True, disk_bytes: int = 1 << 30) -> Path:
    folder = images / "debian"
    folder.mkdir(parents=True)
    (folder / "vmlinux").write_bytes(b"\x7fELF")
    (folder / "initrd.img").write_bytes(b"\x1f\x8b")
    manifest: dict[str, object] = {"name": "debian", "kernel": {"file": "vmlinux"},
                                   "initrd": {"file": "initrd.img"},
                                   "cmdline_base": "console=ttyS0 quiet panic=-1"}
    if disk:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(folder / "root.qcow2"),
                        str(disk_bytes)], check=True, timeout=30)
        manifest["disk"] = {"file": "root.qcow2", "format": "qcow2",
                            "virtual_size": disk_bytes}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _vm(vm_id: str = "vm_abcdefgh", disk_gib: int = DEFAULT_DISK_GIB) -> Vm:
    return Vm(id=vm_id, task_id="task_abcdefgh", owner="alice", name="box", image="debian",
              status="creating", host="local", vcpus=1, memory_mib=512,
              created_at=datetime.now(UTC), ssh_host="127.0.0.1", ssh_port=20022,
              disk_gib=disk_gib)


def _virtual_size(disk: Path) -> int:
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(disk)],
                                     capture_output=True, text=True, check=True,
                                     timeout=30).stdout)
    return int(info["virtual-size"])


def _kind(tmp_path: Path) -> tuple[KernelGuest, GuestRuntime]:
    runtime = GuestRuntime(images_dir=tmp_path / "images", serial_dir=tmp_path / "serial",
                           boot_timeout_s=5, accel=lambda uri: "qemu",
                           disks_dir=tmp_path / "disks")
    kind = KernelGuest("qemu:///system", "debian", runtime, ssh_guests(tmp_path / "keys"),
                       VmFiles(runtime))
    return kind, runtime


def test_debian_is_always_a_known_image() -> None:
    assert "debian" in BUILTIN and "tiny" in BUILTIN


def test_a_debian_vm_on_the_test_driver_runs_at_once_with_512_mib_by_default(
        deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="debian")).vm
    assert (vm.status, vm.image, vm.memory_mib, vm.ssh) == ("running", "debian", 512, None)
    tiny = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="tiny")).vm
    assert tiny.memory_mib == 256


def test_the_root_has_what_agents_need() -> None:
    for package in ("python3", "python3-pip", "python3-venv", "git", "curl", "ca-certificates",
                    "build-essential", "procps", "iproute2", "sudo", "openssh-server",
                    "python-is-python3"):
        assert package in PACKAGES


def test_the_initramfs_loads_the_block_driver_and_mounts_the_overlay_as_root(
        tmp_path: Path) -> None:
    modules = [(name, tmp_path / f"{name}.ko") for name in
               ("virtio_ring", "virtio", "virtio_pci", "virtio_blk", "virtio_net", "virtio_rng")]
    for _, ko in modules:
        ko.write_bytes(b"\x7fELF")
    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        pytest.skip("no busybox here (apt-get install busybox-static)")
    entries = _newc_names(initramfs(busybox, modules))
    assert entries["etc/rift/modules"][1].decode().split() == [n for n, _ in modules]
    assert "virtio_blk" in MODULE_ROOTS
    init = entries["init"][1].decode()
    assert stat.S_IMODE(entries["init"][0]) == 0o755
    assert "/dev/vda /newroot" in init and "switch_root /newroot /usr/lib/rift/init" in init
    assert "rift.key=" in init and "RIFT-INIT" in init


@needs_qemu_img
def test_the_kernel_command_line_carries_the_task_key(tmp_path: Path) -> None:
    image = image_files(tmp_path, _image(tmp_path).name)
    line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG2 task_abcdefgh"
    cmdline = guest_cmdline(image, line)
    assert cmdline.startswith("console=ttyS0 quiet panic=-1 rift.key=")
    assert base64.b64decode(cmdline.rsplit("rift.key=", 1)[1]).decode() == line
    assert image.disk == (tmp_path / "debian" / "root.qcow2").resolve()
    assert image.disk_bytes == 1 << 30


@needs_qemu_img
def test_a_debian_vm_boots_its_own_sparse_overlay_of_the_base_and_it_goes_with_the_vm(
        tmp_path: Path) -> None:
    kind, runtime = _kind(tmp_path)
    base = _image(runtime.images_dir) / "root.qcow2"
    vm = _vm()
    spec = kind.plan(vm)
    overlay = runtime.vm_disks_dir.resolve() / f"{vm.id}.qcow2"
    assert spec.disk == str(overlay) and spec.kernel and spec.initrd
    assert spec.cmdline is not None and "rift.key=" in spec.cmdline
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(overlay)],
                                     capture_output=True, text=True, check=True,
                                     timeout=30).stdout)
    assert info["virtual-size"] == DEFAULT_DISK_GIB * GIB
    assert info["backing-filename"] == str(base.resolve())
    assert overlay.stat().st_blocks * 512 < 1 << 20  # sparse: nothing written yet
    disk = ET.fromstring(build_domain_xml(spec)).find("devices/disk")  # noqa: S314 (our XML)
    assert disk is not None
    assert disk.find("source").get("file") == str(overlay)  # type: ignore[union-attr]
    assert disk.find("target").get("dev") == "vda"  # type: ignore[union-attr]
    kind.clean_up(vm.id)
    assert not overlay.exists()


@needs_qemu_img
def test_a_vm_overlay_is_the_disk_size_it_asked_for_never_smaller_than_the_base(
        tmp_path: Path) -> None:
    kind, runtime = _kind(tmp_path)
    image = _image(runtime.images_dir, disk_bytes=2 * GIB)
    base = image_files(runtime.images_dir, "debian")
    for vm_id, disk_gib, size in (("vm_aaaaaaaa", 3, 3 * GIB), ("vm_bbbbbbbb", 1, 2 * GIB)):
        overlay = kind._overlay(base, _vm(vm_id, disk_gib))
        assert overlay == runtime.vm_disks_dir.resolve() / f"{vm_id}.qcow2"
        assert _virtual_size(overlay) == size, (disk_gib, size)
        assert overlay.stat().st_blocks * 512 < 1 << 20  # sparse: 3 GiB cost nothing yet
    assert _virtual_size(image / "root.qcow2") == 2 * GIB  # the base stays as it was


@needs_qemu_img
def test_tiny_still_boots_without_a_disk(tmp_path: Path) -> None:
    kind, runtime = _kind(tmp_path)
    _image(runtime.images_dir, disk=False)
    spec = kind.plan(_vm())
    assert spec.disk is None
    assert not runtime.vm_disks_dir.exists() or not any(runtime.vm_disks_dir.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="the set-up writes root-owned files")
def test_the_set_up_copy_leaves_the_cached_root_as_debootstrap_left_it(tmp_path: Path) -> None:
    cached = tmp_path / "cached"
    (cached / "etc" / "ssh" / "sshd_config.d").mkdir(parents=True)
    (cached / "etc" / "hostname").write_text("debootstrap-host\n")
    (cached / "etc" / "ssh" / "ssh_host_ed25519_key").write_text("shared secret")
    (cached / "usr" / "share" / "doc" / "git").mkdir(parents=True)
    etc = cached / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "shadow").write_text("root:*:20000:0:99999:7:::\n")
    (etc / "group").write_text("root:x:0:\nsudo:x:27:\n")
    (etc / "gshadow").write_text("root:*::\nsudo:*::\n")
    (etc / "shells").write_text("/bin/sh\n/bin/bash\n")
    (etc / "sudoers.d").mkdir()
    (etc / "skel").mkdir()
    (etc / "skel" / ".profile").write_text("# ~/.profile\n")
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF")
    helper = tmp_path / "rift-exec"
    helper.write_bytes(b"\x7fELF helper")
    shell = tmp_path / "rift-shell"
    shell.write_bytes(b"\x7fELF shell")
    copy = tmp_path / "copy"
    linked_copy(cached, copy)
    set_up(copy, busybox, helper, shell)
    assert (cached / "etc" / "hostname").read_text() == "debootstrap-host\n"
    assert (cached / "etc" / "ssh" / "ssh_host_ed25519_key").exists()
    assert (cached / "usr" / "share" / "doc" / "git").is_dir()
    assert (copy / "etc" / "hostname").read_text() == "rift\n"
    assert not list((copy / "etc" / "ssh").glob("ssh_host_*"))  # each VM makes its own
    assert "PasswordAuthentication no" in (copy / "etc/ssh/sshd_config.d/60-rift.conf").read_text()
    assert os.access(copy / "usr" / "lib" / "rift" / "init", os.X_OK)
    assert os.access(copy / "usr" / "lib" / "rift" / "rift-exec", os.X_OK)
    # root logs in to rift-shell, a shell /etc/shells lists; the cached root keeps bash
    assert os.access(copy / "usr" / "lib" / "rift" / "rift-shell", os.X_OK)
    assert (copy / "etc" / "passwd").read_text().splitlines()[0] == \
        "root:x:0:0:root:/root:/usr/lib/rift/rift-shell"
    assert (copy / "etc" / "shells").read_text() == \
        "/bin/sh\n/bin/bash\n/usr/lib/rift/rift-shell\n"
    # E2B's user: uid 1000, in sudo, a home of its own, sudo without a password
    assert (etc / "passwd").read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert (etc / "group").read_text() == "root:x:0:\nsudo:x:27:\n"
    assert (copy / "etc" / "passwd").read_text().splitlines()[-1] == \
        "user:x:1000:1000::/home/user:/bin/bash"
    assert "sudo:x:27:user" in (copy / "etc" / "group").read_text().splitlines()
    assert "sudo:*::user" in (copy / "etc" / "gshadow").read_text().splitlines()
    assert (copy / "etc" / "shadow").read_text().splitlines()[-1].startswith("user:*:20000:")
    assert "user ALL=(ALL:ALL) NOPASSWD: ALL" in \
        (copy / "etc" / "sudoers.d" / "user").read_text()
    profile = copy / "home" / "user" / ".profile"
    assert profile.read_text() == "# ~/.profile\n"
    assert (profile.stat().st_uid, profile.parent.stat().st_uid) == (1000, 1000)
