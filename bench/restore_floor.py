"""The raw libvirt floor of the three ways to start (SPEC §11), under TCG here:

1. cold boot: `virDomainCreate` of Rift's own domain XML (`guest_spec` +
   `build_domain_xml`) until raw paramiko (the key on the kernel command line)
   runs an exec (`true`) that answers 0;
2. managed save of that guest right after its first exec (`virDomainManagedSave`),
   and the size of the image libvirt wrote;
3. restore: `virDomainCreate` of the saved domain (which restores from the
   managed save image) until an exec answers again on the port already known
   (QEMU sets the forward up anew from the domain XML when it starts).

For `tiny` at 256 and 512 MiB and `debian` at 512 MiB (on its own overlay), each
when its image is built; one guest at a time, each destroyed (its save image
with it) before the next. Prints the medians and ranges; asserts nothing.

    .venv/bin/python bench/restore_floor.py      (or python -m bench.restore_floor)

Needs libvirtd on qemu:///system (scripts/libvirt.sh). Images are looked for in
RIFT_BENCH_IMAGES, the tests' caches (RIFT_TEST_CACHE, /var/cache/rift-tests,
var/cache in the checkout) and the data dir's images (RIFT_DATA_DIR or ./var).
RIFT_BENCH_SAMPLES (default 3) samples per row.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import statistics
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))  # run as a script: this checkout's packages first

import libvirt  # noqa: E402
import paramiko  # noqa: E402

from bench.common import print_table, work_dir  # noqa: E402
from hypervisor.base import GuestDomain, ImageError  # noqa: E402
from hypervisor.disks import make_overlay  # noqa: E402
from hypervisor.domain_xml import build_domain_xml  # noqa: E402
from hypervisor.fork_xml import ForkDomain, fork_domain_xml  # noqa: E402
from hypervisor.image_files import ImageFiles, image_files  # noqa: E402
from hypervisor.kernel_boot import READY_MARKER, guest_spec  # noqa: E402
from hypervisor.kvm import TCG  # noqa: E402
from hypervisor.libvirt import LibvirtHypervisor  # noqa: E402
from hypervisor.save_image import write_fork  # noqa: E402
from rift.guest.keys import key_for_task, load_key  # noqa: E402

URI = "qemu:///system"
SAVE_DIR = Path("/var/lib/libvirt/qemu/save")
RUNS = (("tiny", 256), ("tiny", 512), ("debian", 512))
SAMPLES = int(os.environ.get("RIFT_BENCH_SAMPLES", "3"))
POLL_S = 0.05
BANNER_S = 0.5  # while the guest boots: slirp takes the connection before the guest can
READY_BANNER_S = 10.0  # once the init said RIFT-READY (OpenSSH in `debian` re-execs per
#                        connection, which under TCG takes longer than 0.5 s to greet)
LIMIT_S = 180.0


def image_dirs() -> list[Path]:
    found = [Path(p) for p in (os.environ.get("RIFT_BENCH_IMAGES"),) if p]
    for cache in (os.environ.get("RIFT_TEST_CACHE"), "/var/cache/rift-tests",
                  str(ROOT / "var" / "cache")):
        if cache:
            found += [Path(cache) / "test-images", Path(cache) / "debian-images"]
    data = Path(os.environ.get("RIFT_DATA_DIR") or ROOT / "var")
    found += [data / "images", Path.home() / ".local" / "share" / "rift" / "images"]
    return found


def find_image(name: str) -> ImageFiles | None:
    for folder in image_dirs():
        try:
            return image_files(folder, name)
        except ImageError:
            continue
    return None


@dataclass
class Sample:
    boot_s: float
    save_s: float
    save_mib: float
    restore_call_s: float  # virDomainCreate from the managed save image returns
    restore_s: float  # ... until an exec answers
    serial_kept: bool  # the serial log still holds the boot's lines after restore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exec_until_answer(port: int, key: paramiko.PKey, started: float, serial: Path,
                      booted: bool = False) -> float:
    """Seconds from `started` until an exec of `true` over a new connection answers 0.
    `booted`: the guest booted before (a restore; its serial log starts empty again)."""
    while time.perf_counter() < started + LIMIT_S:
        transport: paramiko.Transport | None = None
        ready = booted or (serial.exists()
                           and READY_MARKER in serial.read_text(errors="replace"))
        banner_s = READY_BANNER_S if ready else BANNER_S
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=banner_s)
            transport = paramiko.Transport(sock)
            transport.banner_timeout = banner_s
            transport.start_client(timeout=10)
            transport.auth_publickey("root", key)
            chan = transport.open_session(timeout=10)
            chan.exec_command("true")
            if chan.recv_exit_status() == 0:
                took = time.perf_counter() - started
                transport.close()
                return took
        except (OSError, EOFError, paramiko.SSHException):
            pass
        if transport is not None:
            transport.close()
        time.sleep(POLL_S)
    raise RuntimeError(f"no exec answered on port {port} within {LIMIT_S:.0f} s")


def one_sample(conn: libvirt.virConnect, image: ImageFiles, memory_mib: int, work: Path,
               public: str, key: paramiko.PKey, n: int) -> Sample:
    name = f"rift-bench-restore-{os.getpid()}-{n}"
    port = free_port()
    serial = work / f"{name}.log"
    overlay = None
    if image.disk is not None:
        overlay = work / f"{name}.qcow2"
        make_overlay(image.disk, overlay, 10 * 2**30)
    spec = guest_spec(image, GuestDomain(
        name=name, task_id="task_benchrst", vm_id=f"vm_benchrst{n}", vcpus=1,
        memory_mib=memory_mib, domain_type=TCG, ssh_port=port, serial_log=serial),
        public, disk=overlay)
    dom = conn.defineXML(build_domain_xml(spec))
    try:
        started = time.perf_counter()
        dom.create()
        boot_s = exec_until_answer(port, key, started, serial)
        serial_before = serial.stat().st_size
        started = time.perf_counter()
        dom.managedSave(0)
        save_s = time.perf_counter() - started
        save_mib = (SAVE_DIR / f"{name}.save").stat().st_size / 2**20
        started = time.perf_counter()
        dom.create()
        restore_call_s = time.perf_counter() - started
        restore_s = exec_until_answer(port, key, started, serial, booted=True)
        serial_kept = serial.stat().st_size >= serial_before
        return Sample(boot_s, save_s, save_mib, restore_call_s, restore_s, serial_kept)
    except BaseException:
        tail = serial.read_text(errors="replace")[-2000:] if serial.exists() else "(none)"
        print(f"{name} ({image.name}, {memory_mib} MiB) failed; its serial log ends:\n{tail}",
              file=sys.stderr)
        raise
    finally:
        put_away(dom, serial, overlay)


def same_state_sample(conn: libvirt.virConnect, domain: str, key: paramiko.PKey, work: Path,
                      n: int) -> float:
    """The raw restore floor of a sleeping VM's own saved state: its managed save
    image and its disk copied aside (not timed) and restored by raw libvirt
    (`virDomainRestore`) as a domain of its own (another name, SSH port and
    serial log), until an exec of `true` answers 0 on a new paramiko connection
    (`key`: the one its guest lets in). Seconds from the restore call; the copy
    and its files go after."""
    name = f"rift-bench-same-{os.getpid()}-{n}"
    port, serial = free_port(), work / f"{name}.log"
    copy, disk = work / f"{name}.save", work / f"{name}.qcow2"
    source = conn.lookupByName(domain)
    saved_xml = str(source.managedSaveGetXMLDesc(libvirt.VIR_DOMAIN_SAVE_IMAGE_XML_SECURE))
    files = _disk_files(saved_xml)
    if "vda" in files:
        shutil.copyfile(files["vda"], disk)
    xml = fork_domain_xml(saved_xml, ForkDomain(
        name=name, uuid=str(uuid.uuid4()), vm_id=f"vm_benchsame{n}", task_id="task_benchsame",
        disk=str(disk) if "vda" in files else None, serial_log=str(serial), ssh_port=port,
        seed=files.get("vdb"), install="rift-bench-floor"))  # no Rift's: not reconciled
    write_fork(SAVE_DIR / f"{domain}.save", copy, xml)  # the state, its header's XML new
    try:
        started = time.perf_counter()
        conn.restore(str(copy))
        return exec_until_answer(port, key, started, serial, booted=True)
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            conn.lookupByName(name).destroy()  # restored from a file: transient
        for made in (copy, disk, serial):
            made.unlink(missing_ok=True)


def _disk_files(xml: str) -> dict[str, str]:
    """The file behind each disk of a domain XML, by its target (vda, vdb, ...)."""
    found: dict[str, str] = {}
    for disk in ET.fromstring(xml).iter("disk"):  # noqa: S314 (libvirt's own XML)
        target, source = disk.find("target"), disk.find("source")
        if target is not None and source is not None and source.get("file"):
            found[str(target.get("dev"))] = str(source.get("file"))
    return found


def put_away(dom: Any, serial: Path, overlay: Path | None) -> None:
    """Destroy and undefine a raw domain (its saved state too) and delete its files."""
    if dom.isActive():
        dom.destroy()
    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
    serial.unlink(missing_ok=True)
    if overlay is not None:
        overlay.unlink(missing_ok=True)


def spread(values: list[float], unit: str = "s", digits: int = 2) -> str:
    med = statistics.median(values)
    return f"{med:.{digits}f} {unit} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> int:
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # every refused try says so
    conn = libvirt.open(URI)
    hv = LibvirtHypervisor(URI)
    versions = f"{hv.versions()}, {os.cpu_count()} cores"
    hv.close()
    rows: list[tuple[str, ...]] = []
    with work_dir("rift-bench-restore-") as tmp:
        work = Path(tmp)
        key_file, public = key_for_task(work / "keys", "task_benchrst")
        key = load_key(key_file)
        n = 0
        for name, memory_mib in RUNS:
            image = find_image(name)
            if image is None:
                print(f"{name}: not built (looked in {', '.join(map(str, image_dirs()))}); skipped")
                continue
            samples = []
            for _ in range(SAMPLES):
                n += 1
                samples.append(one_sample(conn, image, memory_mib, work, public, key, n))
            rows.append((
                name, str(memory_mib), str(len(samples)),
                spread([s.boot_s for s in samples]),
                spread([s.save_s for s in samples]),
                spread([s.save_mib for s in samples], "MiB", 0),
                spread([s.restore_call_s for s in samples]),
                spread([s.restore_s for s in samples]),
                "yes" if all(s.serial_kept for s in samples) else "no",
            ))
    conn.close()
    print_table(f"Raw libvirt floor under TCG: boot, managed save, restore ({versions}; "
                "median (min–max))", rows,
                ("image", "MiB", "n", "create→exec", "managed save", "save image",
                 "restore call", "restore→exec", "serial log kept"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
