"""A host elsewhere's files, through its SSH (rift.guest.links): its disk as the
hypervisor adapter sees it (`SshDisk`), and the files a domain needs there before
it starts or moves there (`RemoteFiles`, the engine's HostFiles port)."""

from __future__ import annotations

import errno
import json
import logging
import shlex
from pathlib import Path

from hypervisor.base import DomainSpec, HypervisorError, ImageError
from hypervisor.commands import run_command
from hypervisor.disks import vm_disks
from hypervisor.host_disk import LOCAL_DISK, HostDisk
from rift.guest.links import HostLinkError, HostLinks, SshTarget, ssh_target
from rift.services.ports.hosts import Overlay

log = logging.getLogger("rift.hosts")


class SshDisk:
    """A host's files elsewhere, at the paths they have there, through its SSH
    (hypervisor.host_disk.HostDisk): what libvirt there saves and restores, and
    the disks beside it. Bytes are copied by the host's own tools (cp, tail), not
    through Rift; what goes wrong comes out as OSError."""

    def __init__(self, links: HostLinks, target: SshTarget) -> None:
        self.links = links
        self.target = target

    def _run(self, command: str, stdin: bytes = b"", timeout_s: float = 600.0) -> bytes:
        try:
            return self.links.run_bytes(self.target, command, stdin, timeout_s=timeout_s)
        except HostLinkError as exc:
            raise OSError(errno.EIO, str(exc)) from exc

    def is_file(self, path: str) -> bool:
        return self._run(f"if [ -f {shlex.quote(path)} ]; then echo yes; fi").strip() == b"yes"

    def size(self, path: str) -> int:
        return int(self._run(f"stat -c %s {shlex.quote(path)}"))

    def read_at(self, path: str, offset: int, count: int) -> bytes:
        return self._run(f"dd if={shlex.quote(path)} iflag=skip_bytes,count_bytes "
                         f"skip={int(offset)} count={int(count)} bs=64K status=none")

    def make_dir(self, path: str) -> None:
        self._run(f"mkdir -p {shlex.quote(path)} && chmod 700 {shlex.quote(path)}")

    def copy_sparse(self, source: str, target: str) -> None:
        self._run(f"cp --sparse=always {shlex.quote(source)} {shlex.quote(target)}")

    def usage(self, folder: str) -> int:
        quoted = shlex.quote(folder)
        listed = self._run(f"if [ -d {quoted} ]; then find {quoted} -maxdepth 1 -type f "
                           "-printf '%b\\n'; fi")
        return sum(int(n) for n in listed.split()) * 512

    def free(self, folder: str) -> int:
        quoted = shlex.quote(folder)
        answer = self._run(f"p={quoted}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
                           "df -B1 --output=avail \"$p\" | tail -n 1", timeout_s=30.0)
        try:
            return int(answer.strip())
        except ValueError as exc:
            raise OSError(errno.EIO, f"df answered {answer[:80]!r}") from exc

    def spliced(self, source: str, head: bytes, offset: int, target: str) -> None:
        partial = shlex.quote(f"{target}.rift-partial")
        self._run(f"umask 077 && {{ cat > {partial} && tail -c +{int(offset) + 1} "
                  f"{shlex.quote(source)} >> {partial} && mv -f {partial} "
                  f"{shlex.quote(target)}; }} || {{ rm -f {partial}; exit 1; }}", head)

    def remove(self, path: str) -> None:
        self._run(f"rm -rf {shlex.quote(path)}")


def host_disk(links: HostLinks, uri: str) -> HostDisk:
    """The files of the host at `uri`: over its SSH when it is elsewhere."""
    target = ssh_target(uri)
    return LOCAL_DISK if target is None else SshDisk(links, target)


def backing_chain(disk: Path) -> list[Path]:
    """The files a qcow2 disk reads from: itself, then its backing files in order."""
    try:
        listed = run_command(["qemu-img", "info", "-U", "--backing-chain", "--output=json",
                              str(disk)], timeout_s=60)
    except ImageError as exc:
        raise HostLinkError(str(exc)) from exc
    return [Path(item["filename"]) for item in json.loads(listed)]


class RemoteFiles:
    """Puts a domain's files on its host before libvirt is asked to start it there:
    the image's (kernel, initrd, base disks: kept, checked by sha256, copied once)
    and the VM's own (its overlay and seed: copied each time), at the paths the
    domain XML names; and the folder its serial log goes in."""

    def __init__(self, links: HostLinks, serial_dir: Path | None = None,
                 disks_dir: Path | None = None) -> None:
        self.links = links
        self.serial_dir = serial_dir  # where VMs' serial logs are (the same path there)
        self.disks_dir = disks_dir  # where VMs' overlays and seeds are

    def prepare(self, uri: str, spec: DomainSpec) -> None:
        target = ssh_target(uri)
        if target is None:
            return
        try:
            for path in (spec.kernel, spec.initrd, spec.restore_from):
                if path is not None:
                    self.links.ensure_file(target, Path(path))
            if spec.disk is not None:
                overlay, *bases = backing_chain(Path(spec.disk))
                for base in reversed(bases):
                    self.links.ensure_file(target, base)
                self.links.ensure_file(target, overlay, fresh=True)
            if spec.seed is not None:
                self.links.ensure_file(target, Path(spec.seed), fresh=True)
            if spec.serial_log is not None:
                self.links.mkdir(target, str(Path(spec.serial_log).parent))
                # made here (0664) before libvirtd opens it for QEMU: its DAC driver
                # gives it to QEMU's own user and group rift-guests, whose member the
                # SSH user is (the ansible role), so Rift still reads and trims it
                serial = shlex.quote(spec.serial_log)
                self.links.run(target, f"if [ ! -e {serial} ]; then "
                               f"(umask 002 && : > {serial}); fi")
        except (HostLinkError, OSError) as exc:
            raise HypervisorError("prepare", f"the VM's files could not be put on "
                                  f"{target.host}: {exc}") from exc

    def receive(self, uri: str, spec: DomainSpec, overlay: Overlay | None) -> None:
        """What a VM moving live here reads from its disk: `spec`'s files, and an
        empty `overlay` (the migration fills it)."""
        self.prepare(uri, spec)
        if overlay is not None:
            self.make_overlay(uri, overlay.base, overlay.path, overlay.size_bytes)

    def make_overlay(self, uri: str, base: str, overlay: str, size_bytes: int) -> None:
        target = ssh_target(uri)
        if target is None:
            raise HypervisorError("prepare", f"{uri} is not a host elsewhere")
        try:
            self.links.ensure_file(target, Path(base))
            self.links.mkdir(target, str(Path(overlay).parent))
            self.links.run(target, "qemu-img create -q -f qcow2 -F qcow2 -b "
                           f"{shlex.quote(base)} {shlex.quote(overlay)} {int(size_bytes)}")
        except (HostLinkError, OSError) as exc:
            raise HypervisorError("prepare", f"no overlay on {target.host}: {exc}") from exc

    def forget(self, uri: str, vm_id: str) -> None:
        """Best effort: a put-away VM's own files on its host (its serial log, overlay
        and seed)."""
        paths = []
        if self.serial_dir is not None:
            paths.append(str(self.serial_dir / f"{vm_id}.log"))
        if self.disks_dir is not None:
            disks = vm_disks(self.disks_dir.resolve(), vm_id)
            paths += [str(disks.overlay), str(disks.seed)]
        self.remove(uri, paths)

    def remove(self, uri: str, paths: list[str]) -> None:
        """Best effort: files on a host elsewhere go."""
        target = ssh_target(uri)
        if target is None or not paths:
            return
        try:
            self.links.run(target, "rm -f " + " ".join(shlex.quote(p) for p in paths))
        except HostLinkError as exc:
            log.warning("could not remove a VM's files on its host",
                        extra={"host": target.host, "error": str(exc)})
