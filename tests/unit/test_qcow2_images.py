"""qcow2 images without QEMU: the cloud-init seed's contents, the domain XML that
boots a VM's overlay with its seed, the catalog's kinds, the sweep that removes
the files of VMs that are gone, and the bounded SSH wait of a guest that prints
no ready marker."""

from __future__ import annotations

import json
import socket
import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from hypervisor.base import DomainSpec, GuestDomain, ImageError
from hypervisor.disks import VmDisks, remove_vm_disks, seed_files, vm_disks, vm_ids_with_disks
from hypervisor.domain_xml import build_domain_xml, validate_spec
from hypervisor.qcow2 import Qcow2Image, image_kind, qcow2_guest_spec, qcow2_image
from rift.catalog import DirectoryImages
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.model import Vm
from rift.guest.errors import GuestError
from rift.guest.shell import SshGuestShell
from rift.services.background import reconcile
from rift.services.context import Deps, GuestRuntime
from rift.services.lifecycle import tasks, vms
from tests.support.engine import ALICE

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBItiKMb60WRZYHdNAnTB9p/iehwos+LVjLTxu2yyPzL rift"
IMAGE = Qcow2Image("debian", Path("/data/images/debian/disk.qcow2"), 2 << 30)
DISKS = VmDisks(Path("/data/disks/vm_abcdefgh.qcow2"), Path("/data/disks/vm_abcdefgh-seed.iso"))


def _spec(**changes: object) -> DomainSpec:
    spec = qcow2_guest_spec(IMAGE, DISKS, GuestDomain(
        name="rift-vm_abcdefgh", task_id="task_abcdefgh", vm_id="vm_abcdefgh", vcpus=1,
        memory_mib=256, domain_type="qemu", ssh_port=23456,
        serial_log=Path("/data/serial/vm_abcdefgh.log")))
    return replace(spec, **changes)  # type: ignore[arg-type]


def test_the_seed_gives_root_the_task_key_and_turns_passwords_off() -> None:
    files = seed_files("vm_abcdefgh", KEY + "\n")
    user_data = files["user-data"].decode()
    assert user_data.startswith("#cloud-config\n")  # cloud-init ignores it otherwise
    config = yaml.safe_load(user_data)
    assert config["ssh_authorized_keys"] == [KEY]
    assert config["disable_root"] is False and config["ssh_pwauth"] is False
    assert config["ssh_genkeytypes"] == ["ed25519"]
    assert config["write_files"] == [{
        "path": "/etc/ssh/sshd_config.d/60-rift.conf", "permissions": "0644",
        "content": "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"}]
    meta = yaml.safe_load(files["meta-data"])
    # A fresh instance id per VM: cloud-init runs its first boot on each overlay.
    assert meta == {"instance-id": "vm_abcdefgh", "local-hostname": "vm-abcdefgh"}


def test_a_key_that_is_not_one_line_is_refused() -> None:
    with pytest.raises(ImageError):
        seed_files("vm_abcdefgh", KEY + "\nruncmd: [reboot]")
    with pytest.raises(ImageError):
        seed_files("vm_abcdefgh", "  ")


def test_a_qcow2_domain_boots_its_overlay_with_the_seed_beside_it() -> None:
    root = ET.fromstring(build_domain_xml(_spec()))  # noqa: S314 (our own XML)
    assert root.find("os/kernel") is None and root.find("os/boot") is None
    disks = root.findall("devices/disk")
    assert [(d.get("device"), d.find("target").get("dev"),  # type: ignore[union-attr]
             d.find("driver").get("type"), d.find("source").get("file"))  # type: ignore[union-attr]
            for d in disks] == [
        ("disk", "vda", "qcow2", str(DISKS.overlay)),
        ("disk", "vdb", "raw", str(DISKS.seed)),
    ]
    assert disks[0].find("boot").get("order") == "1"  # type: ignore[union-attr]
    assert disks[1].find("readonly") is not None and disks[1].find("boot") is None
    assert root.find("devices/serial/source").get("path") == "/data/serial/vm_abcdefgh.log"  # type: ignore[union-attr]
    args = [a.get("value") for a in root.iter("{http://libvirt.org/schemas/domain/qemu/1.0}arg")]
    assert "user,id=n0,hostfwd=tcp:127.0.0.1:23456-:22" in args
    vm = root.find("metadata/{https://rift.dev/xmlns/domain/1}vm")
    assert vm is not None and vm.get("image") == "debian"


def test_a_kernel_domain_still_boots_its_kernel() -> None:
    spec = _spec(disk=None, seed=None, kernel="/img/vmlinux", initrd="/img/initrd.img",
                 cmdline="console=ttyS0")
    root = ET.fromstring(build_domain_xml(spec))  # noqa: S314
    assert root.findtext("os/kernel") == "/img/vmlinux" and not root.findall("devices/disk")


def test_disk_and_seed_paths_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="disk"):
        validate_spec(_spec(disk="disks/vm.qcow2"))
    with pytest.raises(ValueError, match="seed"):
        validate_spec(_spec(seed="seed.iso"))


def _manifest(images: Path, name: str, manifest: dict[str, object]) -> None:
    (images / name).mkdir(parents=True)
    (images / name / "manifest.json").write_text(json.dumps(manifest))


def test_the_catalog_tells_qcow2_images_from_kernel_images(tmp_path: Path) -> None:
    _manifest(tmp_path, "tiny", {"name": "tiny", "kernel": {"file": "vmlinux"}})
    _manifest(tmp_path, "debian", {"name": "debian", "kind": "qcow2",
                                   "disk": {"file": "disk.qcow2", "virtual_size": 1 << 30}})
    (tmp_path / "debian" / "disk.qcow2").write_bytes(b"QFI\xfb")
    images = DirectoryImages(tmp_path)
    assert images.names() == ["debian", "tiny"]
    assert (images.kind("tiny"), images.kind("debian"), images.kind("nothing")) == \
        ("kernel", "qcow2", "kernel")
    assert image_kind(tmp_path, "nothing") is None
    found = qcow2_image(tmp_path, "debian")
    assert found.disk == (tmp_path / "debian" / "disk.qcow2").resolve()
    assert found.virtual_size == 1 << 30
    with pytest.raises(ImageError, match="rift image add"):
        qcow2_image(tmp_path, "tiny")


def test_vm_files_are_named_after_the_vm_and_removed_with_it(tmp_path: Path) -> None:
    disks = vm_disks(tmp_path, "vm_abcdefgh")
    disks.overlay.write_bytes(b"x")
    disks.seed.write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not a VM's")
    assert vm_ids_with_disks(tmp_path) == {"vm_abcdefgh"}
    remove_vm_disks(tmp_path, "vm_abcdefgh")
    remove_vm_disks(tmp_path, "vm_abcdefgh")  # absent is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    with pytest.raises(ImageError):
        vm_disks(tmp_path, "../escape")


def test_the_sweep_removes_the_disks_of_vms_that_are_gone_and_keeps_the_live_ones(
        deps: Deps, tmp_path: Path) -> None:
    runtime = GuestRuntime(images_dir=tmp_path / "images", serial_dir=tmp_path / "serial",
                           boot_timeout_s=5, accel=lambda uri: "qemu",
                           disks_dir=tmp_path / "disks")
    deps = replace(deps, runtime=runtime)
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    live = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm.id
    gone = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm.id
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=gone, handle=str(opened.handle)))
    runtime.vm_disks_dir.mkdir()
    for vm_id in (live, gone, "vm_zzzzzzzz"):  # the last has no row at all
        disks = vm_disks(runtime.vm_disks_dir, vm_id)
        disks.overlay.write_bytes(b"x")
        disks.seed.write_bytes(b"x")
    report = reconcile.reconcile(deps)
    assert sorted(report.disks_removed) == sorted([gone, "vm_zzzzzzzz"])
    assert vm_ids_with_disks(runtime.vm_disks_dir) == {live}
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=live,
        handle=str(opened.handle)))  # teardown removes them
    assert vm_ids_with_disks(runtime.vm_disks_dir) == set()


def test_a_guest_without_markers_that_never_lets_us_in_fails_within_the_wait(
        tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serial = tmp_path / "vm.log"
    serial.write_text("Debian GNU/Linux 12 vm-abcdefgh ttyS0\n")
    vm = Vm(id="vm_abcdefgh", task_id="task_abcdefgh", owner="alice", name="box",
            image="debian", status="creating", host="local", vcpus=1, memory_mib=256,
            created_at=datetime.now(UTC), ssh_host="127.0.0.1", ssh_port=port)
    shell = SshGuestShell(tmp_path / "keys")
    started = time.monotonic()
    with pytest.raises(GuestError) as info:
        shell.life.connect_when_ready(vm, serial, 1.5, markers=False)
    assert time.monotonic() - started < 5
    assert "no SSH login succeeded" in info.value.message
    assert "ttyS0" in info.value.message  # the serial console's tail says how far it got
    shell.close()
