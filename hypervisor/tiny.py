"""Building the `tiny` image from Debian packages.

`tiny` is the kernel of Debian's `linux-image-*-cloud-amd64` (downloaded with
`apt-get download` into a cache and unpacked with `dpkg-deb -x`, never
installed; see hypervisor.packages and hypervisor.cloud_kernel) plus an
initramfs (hypervisor.cpio) of `busybox-static`, `dropbear-bin`'s dropbear
(with the shared libraries `ldd` names), the virtio modules in load order,
Rift's exec helper (hypervisor.exec_helper) and `guest_init.sh` as `/init`.
Nothing is downloaded from anywhere but the package registry. A build whose
inputs (package versions, init script, helper, builder version) match the
manifest of the image already there is skipped (hypervisor.manifest).

Layout of `<images dir>/tiny/`: see hypervisor.image_files.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.cloud_kernel import kernel_file, module_order, uncompressed_kernel
from hypervisor.commands import run_command
from hypervisor.cpio import MTIME, Archive
from hypervisor.exec_helper import GUEST_PATH, build_inputs, exec_helper
from hypervisor.kernel_boot import CMDLINE_BASE
from hypervisor.manifest import MANIFEST, digest, file_facts, sha256, swap_in, up_to_date
from hypervisor.packages import (
    download,
    installed_file,
    kernel_package,
    owners,
    package_version,
    shared_libs,
    unpack,
)

BUILDER_VERSION = 1
# Roots of the module set; their dependencies are loaded first, in order.
MODULE_ROOTS = ("virtio_pci", "virtio_net", "virtio_rng", "virtio_blk")  # virtio_blk: volumes
INIT_SCRIPT = Path(__file__).with_name("guest_init.sh")


def build_tiny(images_dir: Path, *, cache_dir: Path | None = None, force: bool = False) -> Path:
    """Build `tiny` into `images_dir/tiny/` and answer that folder.

    .debs are cached in `cache_dir` (default `images_dir/.cache/debs`). Skips the
    build when the image there was made from the same inputs, unless `force`.
    Raises ImageError naming what is missing.
    """
    images_dir = images_dir.resolve()
    cache = (cache_dir or images_dir / ".cache" / "debs").resolve()
    cache.mkdir(parents=True, exist_ok=True)
    busybox = static_busybox()
    dropbear = installed_file("dropbear-bin", "/usr/sbin/dropbear")
    dropbearkey = installed_file("dropbear-bin", "/usr/bin/dropbearkey")
    kernel_pkg, kernel_version = kernel_package()
    libs = sorted(shared_libs([dropbear, dropbearkey]))
    packages = {
        kernel_pkg: kernel_version,
        "busybox-static": package_version("busybox-static"),
        "dropbear-bin": package_version("dropbear-bin"),
    }
    packages |= {pkg: package_version(pkg) for pkg in sorted(owners(libs))}
    inputs = digest(json.dumps({"builder": BUILDER_VERSION, "packages": packages,
                                "init": sha256(INIT_SCRIPT.read_bytes()),
                                "rift_exec": build_inputs(),
                                "cmdline": CMDLINE_BASE, "roots": MODULE_ROOTS}).encode())
    target = images_dir / "tiny"
    if not force and up_to_date(target, inputs):
        return target

    deb = download(kernel_pkg, kernel_version, cache)
    images_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=images_dir))
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
        archive = Archive()
        _add_root(archive, busybox, [dropbear, dropbearkey], libs, modules)
        helper = exec_helper(images_dir / ".cache" / "helpers")
        archive.file(GUEST_PATH.lstrip("/"), helper.read_bytes(), 0o755)
        initrd = out / "initrd.img"
        initrd.write_bytes(gzip.compress(archive.finish(), compresslevel=6, mtime=MTIME))
        manifest = {
            "name": "tiny",
            "builder": BUILDER_VERSION,
            "inputs": inputs,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "kernel": {"file": kernel.name, "release": release, "package": kernel_pkg,
                       "version": kernel_version, **file_facts(kernel)},
            "initrd": {"file": initrd.name, "compression": "gzip", **file_facts(initrd)},
            "cmdline_base": CMDLINE_BASE,
            "modules": [name for name, _ in modules],
            "packages": packages,
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        swap_in(out, target, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def static_busybox() -> Path:
    busybox = installed_file("busybox-static", "/bin/busybox")
    with busybox.open("rb") as f:
        head = f.read(4096)
    if b"/lib64/ld-linux" in head:  # an ELF interpreter: the dynamic busybox
        raise ImageError("/bin/busybox is not the static one; apt-get install busybox-static")
    return busybox


def _add_root(archive: Archive, busybox: Path, binaries: list[Path], libs: list[Path],
              modules: list[tuple[str, Path]]) -> None:
    for folder, mode in (("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755),
                       ("tmp", 0o1777), ("root", 0o700), ("etc/dropbear", 0o700),
                       ("var/log", 0o755), ("mnt", 0o755)):
        archive.directory(folder, mode)
    archive.char_device("dev/console", 5, 1)
    archive.char_device("dev/null", 1, 3, 0o666)
    archive.file("bin/busybox", busybox.read_bytes(), 0o755)
    applets = run_command([str(busybox), "--list-full"]).split()
    for applet in applets:
        if applet != "bin/busybox":
            archive.symlink(applet, "/bin/busybox")
    for binary in binaries:
        archive.file(str(binary), binary.read_bytes(), 0o755)
    for lib in libs:
        archive.file(str(lib), lib.resolve().read_bytes(), 0o755)
    for module, ko in modules:
        archive.file(f"lib/modules/{module}.ko", ko.read_bytes())
    archive.file("etc/rift/modules", "".join(f"{name}\n" for name, _ in modules).encode())
    archive.file("init", INIT_SCRIPT.read_bytes(), 0o755)
    archive.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    archive.file("etc/shadow", b"root:*:19000:0:99999:7:::\n", 0o600)
    archive.file("etc/group", b"root:x:0:\ntty:x:5:\n")
    archive.file("etc/shells", b"/bin/sh\n/bin/ash\n")
    archive.file("etc/nsswitch.conf", b"passwd: files\ngroup: files\nshadow: files\n"
                 b"hosts: files dns\n")
    archive.file("etc/hosts", b"127.0.0.1 localhost\n10.0.2.15 rift\n")
    archive.file("etc/inittab", b"::ctrlaltdel:/sbin/poweroff -f\n::shutdown:/bin/sync\n")
