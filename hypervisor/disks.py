"""Each VM's own disk files, under the data dir's `disks/`, named after the VM
id: a copy-on-write overlay (vda) on a read-only base disk that is never
written, and, for images that run cloud-init, a NoCloud seed (vdb, read-only):
an ISO 9660 volume labelled `cidata` whose `user-data` authorizes the task's
key for root and turns password logins off. They go with the VM
(`remove_vm_disks`); the sweep finds those a crash left (`vm_ids_with_disks`).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.commands import run_command

SEED_LABEL = "cidata"  # the volume label cloud-init's NoCloud looks for
SSHD_DROP_IN = "/etc/ssh/sshd_config.d/60-rift.conf"  # read first: sshd's first value wins
SSHD_NO_PASSWORDS = "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
DISK_TIMEOUT_S = 600  # copying a large image may take a while
_VM_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# ISO 9660 makers, in order of preference; each takes mkisofs's options.
_ISO_MAKERS = (("genisoimage",), ("mkisofs",), ("xorrisofs",), ("xorriso", "-as", "mkisofs"))


@dataclass(frozen=True)
class VmDisks:
    """One VM's own files: its overlay (vda) and its NoCloud seed (vdb, read-only)."""

    overlay: Path
    seed: Path


def vm_disks(disks_dir: Path, vm_id: str) -> VmDisks:
    """Where a VM's overlay and seed live (whether or not they exist)."""
    if not _VM_ID.fullmatch(vm_id):
        raise ImageError(f"VM id {vm_id!r} cannot name a file")
    return VmDisks(overlay=disks_dir / f"{vm_id}.qcow2", seed=disks_dir / f"{vm_id}-seed.iso")


def make_overlay(base: Path, overlay: Path, size_bytes: int | None = None) -> None:
    """A qcow2 overlay at `overlay` backed by the qcow2 `base` (which stays unwritten),
    of `size_bytes` (sparse; default: the base's size)."""
    size = [] if size_bytes is None else [str(size_bytes)]
    run_command(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2",
                 "-b", str(base), str(overlay), *size], timeout_s=DISK_TIMEOUT_S)


def seed_files(vm_id: str, public_key_line: str) -> dict[str, bytes]:
    """The NoCloud `meta-data` and `user-data` of one VM: its id is the instance id
    (so cloud-init runs its first boot), root logs in with the task's key, and
    password logins are off from sshd's first start. Values go in as JSON strings,
    which YAML reads as is."""
    key = public_key_line.strip()
    if "\n" in key or not key:
        raise ImageError("the public key must be one OpenSSH line")
    hostname = vm_id.replace("_", "-").lower()
    meta = f"instance-id: {json.dumps(vm_id)}\nlocal-hostname: {json.dumps(hostname)}\n"
    user = (
        "#cloud-config\n"
        "# Written by Rift: root logs in with the task's key; no passwords.\n"
        "disable_root: false\n"
        f"ssh_authorized_keys:\n  - {json.dumps(key)}\n"
        "# Only an ed25519 host key: RSA takes some 20 s to make under TCG.\n"
        "ssh_genkeytypes: [ed25519]\n"
        "# Passwords off before sshd first starts (write_files runs in cloud-init's\n"
        "# init stage; ssh_pwauth only later, in its config stage, after Rift is in).\n"
        "write_files:\n"
        f"  - path: {SSHD_DROP_IN}\n"
        "    permissions: '0644'\n"
        f"    content: {json.dumps(SSHD_NO_PASSWORDS)}\n"
        "ssh_pwauth: false\n"
    )
    return {"meta-data": meta.encode(), "user-data": user.encode()}


def make_seed(path: Path, files: dict[str, bytes]) -> None:
    """An ISO 9660 volume labelled `cidata` holding `files`, written to `path`."""
    maker = iso_maker()
    with tempfile.TemporaryDirectory(prefix=".seed-", dir=path.parent) as tmp:
        for file_name, data in files.items():
            (Path(tmp) / file_name).write_bytes(data)
        partial = Path(tmp) / "seed.iso"
        run_command([*maker, "-quiet", "-output", str(partial), "-volid", SEED_LABEL,
                     "-joliet", "-rock", *sorted(files)], cwd=Path(tmp),
                    timeout_s=DISK_TIMEOUT_S)
        partial.replace(path)


def iso_maker() -> tuple[str, ...]:
    """The first ISO 9660 maker installed; ImageError naming the package when none is."""
    for argv in _ISO_MAKERS:
        if shutil.which(argv[0]) is not None:
            return argv
    raise ImageError("no genisoimage (or xorriso) to write the cloud-init seed; "
                     "apt-get install genisoimage (scripts/libvirt.sh installs it)")


def remove_vm_disks(disks_dir: Path, vm_id: str) -> None:
    """Delete the VM's overlay and seed; absent is fine."""
    disks = vm_disks(disks_dir, vm_id)
    disks.overlay.unlink(missing_ok=True)
    disks.seed.unlink(missing_ok=True)


def vm_ids_with_disks(disks_dir: Path) -> set[str]:
    """The VM ids that have an overlay or a seed in `disks_dir`."""
    if not disks_dir.is_dir():
        return set()
    found: set[str] = set()
    for path in disks_dir.iterdir():
        if path.name.endswith("-seed.iso"):
            found.add(path.name.removesuffix("-seed.iso"))
        elif path.name.endswith(".qcow2"):
            found.add(path.name.removesuffix(".qcow2"))
    return {vm_id for vm_id in found if _VM_ID.fullmatch(vm_id)}
