"""Building the `debian` image from Debian packages.

`debian` is the cloud kernel `tiny` boots (hypervisor.cloud_kernel), a
read-only base disk holding a Debian 12 root (hypervisor.debian_root), and an
initramfs of a static busybox, the virtio modules (block, net, rng) and Rift's
own init (`debian_init.sh`): it mounts the VM's copy-on-write overlay of the
base disk as the root and switch_roots into Debian, where the second half of
the init starts sshd. No systemd, no cloud-init.

The base disk is ext4 made by `mkfs.ext4 -d` from the root folder (no loop
devices, no mount), sized to what the root holds plus room, then converted to
qcow2: the file holds only the blocks in use (a sparse raw file would too,
until something copies it without `--sparse`), and each VM's overlay is a
qcow2 backed by it (hypervisor.disks.make_overlay), as large as the VM's disk;
the init grows the file system to it. A build whose inputs (the root's key,
package versions, init, builder version) match the manifest there is skipped.

Layout of `<images dir>/debian/`: `vmlinux`, `initrd.img`, `root.qcow2`,
`manifest.json` (hypervisor.image_files reads it).
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from hypervisor.cloud_kernel import kernel_file, module_order, uncompressed_kernel
from hypervisor.commands import run_command
from hypervisor.cpio import MTIME, Archive
from hypervisor.debian_root import debian_root, linked_copy, set_up, set_up_digest
from hypervisor.disks import DISK_TIMEOUT_S
from hypervisor.exec_helper import exec_helper, login_shell
from hypervisor.kernel_boot import CMDLINE_BASE
from hypervisor.manifest import (
    MANIFEST,
    digest,
    file_facts,
    sha256,
    sha256_file,
    swap_in,
    up_to_date,
)
from hypervisor.packages import download, kernel_package, package_version, unpack
from hypervisor.tiny import static_busybox

BUILDER_VERSION = 1
NAME = "debian"
MODULE_ROOTS = ("virtio_pci", "virtio_blk", "virtio_net", "virtio_rng")
INIT_SCRIPT = Path(__file__).with_name("debian_init.sh")
DISK_FILE = "root.qcow2"
MIB = 1 << 20
ROOM_MIB = 256  # free space in the base file system beyond what the root holds


def build_debian(images_dir: Path, *, cache_dir: Path | None = None,
                 force: bool = False) -> Path:
    """Build `debian` into `images_dir/debian/` and answer that folder.

    .debs and the debootstrapped root are cached in `cache_dir` (default
    `images_dir/.cache`). Skips the build when the image there was made from
    the same inputs, unless `force`. Raises ImageError naming what is missing.
    """
    images_dir = images_dir.resolve()
    cache = (cache_dir or images_dir / ".cache").resolve()
    busybox = static_busybox()
    helper = exec_helper(images_dir / ".cache" / "helpers")
    shell = login_shell(images_dir / ".cache" / "helpers")
    kernel_pkg, kernel_version = kernel_package()
    packages = {kernel_pkg: kernel_version, "busybox-static": package_version("busybox-static"),
                "e2fsprogs": package_version("e2fsprogs")}
    root, root_key = debian_root(cache)
    inputs = digest(json.dumps({"builder": BUILDER_VERSION, "packages": packages,
                                "root": root_key, "set_up": set_up_digest(busybox, helper, shell),
                                "init": sha256(INIT_SCRIPT.read_bytes()),
                                "cmdline": CMDLINE_BASE, "roots": MODULE_ROOTS}).encode())
    target = images_dir / NAME
    if not force and up_to_date(target, inputs, ("kernel", "initrd", "disk")):
        return target

    (cache / "debs").mkdir(parents=True, exist_ok=True)
    deb = download(kernel_pkg, kernel_version, cache / "debs")
    images_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".debian-build-", dir=images_dir))
    try:
        unpacked = work / "deb"
        unpack(deb, unpacked)
        release, vmlinuz = kernel_file(unpacked)
        out = work / "out"
        out.mkdir()
        kernel = uncompressed_kernel(vmlinuz, out / "vmlinux")
        if kernel is None:
            kernel = out / "vmlinuz"
            shutil.copyfile(vmlinuz, kernel)
        modules = module_order(unpacked / "lib" / "modules" / release, MODULE_ROOTS)
        initrd = out / "initrd.img"
        initrd.write_bytes(gzip.compress(initramfs(busybox, modules), compresslevel=6,
                                         mtime=MTIME))
        tree = work / "root"
        linked_copy(root, tree)
        set_up(tree, busybox, helper, shell)
        disk = out / DISK_FILE
        virtual_size = base_disk(tree, work / "root.raw", disk)
        manifest = {
            "name": NAME,
            "builder": BUILDER_VERSION,
            "inputs": inputs,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "kernel": {"file": kernel.name, "release": release, "package": kernel_pkg,
                       "version": kernel_version, **file_facts(kernel)},
            "initrd": {"file": initrd.name, "compression": "gzip", **file_facts(initrd)},
            "disk": {"file": DISK_FILE, "format": "qcow2", "filesystem": "ext4",
                     "virtual_size": virtual_size, "bytes": disk.stat().st_size,
                     "sha256": sha256_file(disk), "root": root_key},
            "cmdline_base": CMDLINE_BASE,
            "modules": [name for name, _ in modules],
            "packages": packages,
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        swap_in(out, target, work)
        (target / DISK_FILE).chmod(0o444)  # the base disk is never written
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def initramfs(busybox: Path, modules: list[tuple[str, Path]]) -> bytes:
    """The initramfs (uncompressed newc): busybox, the modules in load order, the init."""
    archive = Archive()
    for folder, mode in (("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755),
                         ("tmp", 0o1777), ("newroot", 0o755)):
        archive.directory(folder, mode)
    archive.char_device("dev/console", 5, 1)
    archive.char_device("dev/null", 1, 3, 0o666)
    archive.file("bin/busybox", busybox.read_bytes(), 0o755)
    for applet in run_command([str(busybox), "--list-full"]).split():
        if applet != "bin/busybox":
            archive.symlink(applet, "/bin/busybox")
    for module, ko in modules:
        archive.file(f"lib/modules/{module}.ko", ko.read_bytes())
    archive.file("etc/rift/modules", "".join(f"{name}\n" for name, _ in modules).encode())
    archive.file("etc/inittab", b"::ctrlaltdel:/sbin/poweroff -f\n::shutdown:/bin/sync\n")
    archive.file("init", INIT_SCRIPT.read_bytes(), 0o755)
    return archive.finish()


def base_disk(root: Path, raw: Path, disk: Path) -> int:
    """ext4 of `root` (mkfs.ext4 -d, into a sparse raw file) converted to the qcow2
    `disk`; answers its virtual size in bytes."""
    used = int(run_command(["du", "-sb", "--apparent-size", str(root)]).split()[0])
    size_mib = (used * 5 // 4 // MIB + ROOM_MIB + 63) // 64 * 64
    with raw.open("wb") as f:
        f.truncate(size_mib * MIB)
    # No lazy init: the guest would zero the tables later, writing its overlay.
    run_command(["mkfs.ext4", "-q", "-F", "-L", "rift-root", "-m", "0",
                 "-E", "lazy_itable_init=0,lazy_journal_init=0", "-d", str(root), str(raw)],
                timeout_s=DISK_TIMEOUT_S)
    run_command(["qemu-img", "convert", "-O", "qcow2", str(raw), str(disk)],
                timeout_s=DISK_TIMEOUT_S)
    raw.unlink()
    return size_mib * MIB


