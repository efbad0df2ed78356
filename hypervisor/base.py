"""The hypervisor port: what Rift asks of a host, and the values it gets back.

Nothing here imports libvirt; `hypervisor.libvirt` is the real adapter and
`hypervisor.fake` the in-memory one beside it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

# The group of the QEMU processes of guests with an egress allowlist (SPEC §13);
# every other guest's QEMU runs in qemu.conf's group, rift-guests.
PROXIED_GROUP = "rift-proxied"
# The unprivileged user QEMU runs as (qemu.conf's `user`, made by scripts/libvirt.sh,
# scripts/netns-hosts.sh and the ansible hypervisor role), and its own group: the
# folders QEMU passes through on the way to its files belong to that group.
QEMU_USER = "rift-qemu"


def elsewhere(uri: str) -> bool:
    """Whether a libvirt URI reaches its host over SSH (`qemu+ssh://…`): a host of
    another machine, whose loopback and files are not this machine's."""
    return urlsplit(uri).scheme.endswith("+ssh")


CPU_PERIOD_US = 100_000  # the CFS period of every quota Rift sets (libvirt's default)


@dataclass(frozen=True)
class CpuLimits:
    """What a guest's QEMU may take of its host's CPUs (libvirt's `<cputune>`, applied
    through the host's cpu cgroup): `weight`, its share against other guests when
    the CPUs are busy (cgroup v1 `cpu.shares`, 1024 being a process at nice 0; 0:
    libvirt's default), and `quota`, the fraction of one core each vCPU thread may
    use per period (under TCG the guest's code runs on those threads; 0: no cap).
    QEMU's other threads (its main loop, I/O, a restore's loading) may use one
    core in all when a quota is set."""

    weight: int = 0
    quota: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 262144:
            raise ValueError(f"a CPU weight is 0-262144, not {self.weight}")
        if not 0 <= self.quota <= 1:
            raise ValueError(f"a CPU quota is a fraction of one core, 0-1, not {self.quota}")

    @property
    def quota_us(self) -> int:
        """Each vCPU's quota per CPU_PERIOD_US, in µs (0: none); libvirt takes 1000 or more."""
        return max(1000, round(self.quota * CPU_PERIOD_US)) if self.quota else 0

    def __bool__(self) -> bool:
        return bool(self.weight or self.quota)


@dataclass(frozen=True)
class GuestDomain:
    """Who a Rift guest's domain is and how it is reached, whichever way it boots (a
    kernel image, a qcow2 image): its name, task and VM, its size, libvirt's domain
    type (kvm or qemu), its SSH port on 127.0.0.1 and its serial log."""

    name: str
    task_id: str
    vm_id: str
    vcpus: int
    memory_mib: int
    domain_type: str
    ssh_port: int
    serial_log: Path


@dataclass(frozen=True)
class DomainSpec:
    """Everything needed to define and start one domain."""

    name: str  # libvirt domain name, e.g. "rift-vm_k3v9x2m7"
    task_id: str
    vm_id: str
    vcpus: int
    memory_mib: int
    image: str
    domain_type: str = "test"  # "test" (test driver), "qemu" (TCG) or "kvm"
    kernel: str | None = None  # direct kernel boot
    initrd: str | None = None
    cmdline: str | None = None
    ssh_port: int | None = None  # host loopback port forwarded to guest :22
    serial_log: str | None = None  # file the guest's serial console writes to
    disk: str | None = None  # a qcow2 file as vda; the guest boots from it when no kernel
    seed: str | None = None  # a read-only vdb beside it (a cloud-init NoCloud seed)
    install: str | None = None  # the control plane that made it (reconciliation scope)
    # A saved state to start from instead of booting (a snapshot image's VMs):
    # `create` forks it (`fork_state`) under this spec's name, disk, serial and port.
    restore_from: str | None = None
    # The guest reaches nothing off the VM (egress `none`): QEMU's user network is
    # restricted to what is forwarded into it (its SSH port).
    restrict: bool = False
    # The guest reaches the networks only through Rift's egress proxy (an egress
    # allowlist): QEMU runs in the group PROXIED_GROUP, whose connections the
    # host's firewall (hypervisor/guest_isolation.nft) refuses save to the proxy.
    proxied: bool = False
    # The uid QEMU runs as on the host (qemu.conf's `user`, as libvirt's DAC base
    # label says): a proxied guest's QEMU runs as it, in PROXIED_GROUP. Filled by the
    # hypervisor that starts the domain; None: the host did not say (root is never
    # assumed: see domain_xml._process_label).
    qemu_uid: int | None = None
    # Its QEMU's CPU limits (`<cputune>`); filled by the hypervisor that starts the
    # domain from its host's settings. None or empty: none.
    cpu: CpuLimits | None = None


@dataclass(frozen=True)
class VolumeDisk:
    """A volume as a running domain's disk (SPEC §18): its qcow2 file on the host,
    the guest's disk name (`vdc`, ...), the serial the guest finds it by (the
    volume id) and whether the guest may only read it."""

    path: str
    target: str
    serial: str
    read_only: bool = False


@dataclass(frozen=True)
class DomainRecord:
    """One domain as a host reports it."""

    name: str
    task_id: str | None  # from Rift metadata; None when the domain carries none
    vm_id: str | None
    active: bool
    install: str | None = None  # the Rift installation that made it, from its metadata
    saved: bool = False  # stopped with a managed save image: `restore` resumes it


@dataclass(frozen=True)
class DomainStats:
    """What a running domain uses, from libvirt's domain statistics; None where the
    host does not say (libvirt's test driver says nothing)."""

    cpu_time_ns: int | None = None  # the vCPUs' time since the domain started
    memory_rss_kib: int | None = None  # the QEMU process's resident memory
    disk_allocation_bytes: int | None = None  # what its own disk (vda) holds on the host


@dataclass(frozen=True)
class HostInfo:
    """The size of a host, as its hypervisor reports it."""

    driver: str  # "test", "qemu", "fake", ...
    vcpus: int
    memory_mib: int


class HypervisorError(Exception):
    """The hypervisor refused.

    `.message` holds the hypervisor's own words, `.op` what we tried
    ("open", "define", "start", "destroy", "save", "restore", "set_owner",
    ...), `.code` libvirt's error
    number when there is one.
    """

    def __init__(self, op: str, message: str, code: int | None = None) -> None:
        super().__init__(f"{op}: {message}")
        self.op = op
        self.message = message
        self.code = code


class ImageError(Exception):
    """An image could not be built or found; the message says what to do."""


class HostDisk(Protocol):
    """Files at absolute paths on one host."""

    def is_file(self, path: str) -> bool: ...

    def size(self, path: str) -> int:
        """The file's length in bytes."""
        ...

    def read_at(self, path: str, offset: int, count: int) -> bytes:
        """Up to `count` bytes of the file from `offset` (fewer at its end)."""
        ...

    def make_dir(self, path: str) -> None:
        """A folder only its owner reads (0700), and its parents."""
        ...

    def copy_sparse(self, source: str, target: str) -> None:
        """Copy a (qcow2) file, its holes kept holes."""
        ...

    def usage(self, folder: str) -> int:
        """The bytes the files directly in `folder` take on disk; 0 when it is absent."""
        ...

    def free(self, folder: str) -> int:
        """The bytes still free in the file system that holds `folder` (or its
        nearest existing parent)."""
        ...

    def spliced(self, source: str, head: bytes, offset: int, target: str) -> None:
        """Write at `target` (mode 0600, under a temporary name renamed onto it once
        complete) `head` followed by the bytes of `source` from `offset` to its end,
        copied on the host, not through Rift."""
        ...

    def remove(self, path: str) -> None:
        """The file or folder (and all in it) goes; absent is fine."""
        ...


class Hypervisor(Protocol):
    """One connection to one host."""

    uri: str
    disk: HostDisk  # the files of the machine it runs on: where save_state writes

    def info(self) -> HostInfo:
        """The host's size."""
        ...

    def create(self, spec: DomainSpec) -> None:
        """Define and start a domain.

        On any failure nothing is left defined and HypervisorError is raised
        (ValueError for a spec that cannot be rendered).
        """
        ...

    def destroy(self, name: str) -> bool:
        """Stop (if running) and undefine a domain; False when there is none."""
        ...

    def list_domains(self) -> list[DomainRecord]:
        """Every domain on the connection, with Rift metadata parsed."""
        ...

    def save(self, name: str) -> None:
        """Save a running domain's memory to disk (libvirt managed save).

        The domain stops but stays defined, listed with `saved=True`; `restore`
        resumes it where it was, `destroy` removes it and its saved state.
        """
        ...

    def restore(self, name: str) -> None:
        """Start a saved domain from its saved state.

        HypervisorError(op="restore") when the domain has no saved state (it is
        never cold-booted instead) or the hypervisor refuses.
        """
        ...

    def save_state(self, name: str, path: str) -> None:
        """Save a running domain's memory to the file `path` (virDomainSave): the
        domain stops but stays defined, with no managed save; `restore_state`
        runs it again from the file, `fork_state` starts new domains from it."""
        ...

    def restore_state(self, path: str) -> None:
        """Run the domain a `save_state` file names again from that file (the file
        stays). HypervisorError(op="restore") when libvirt refuses."""
        ...

    def fork_state(self, path: str, spec: DomainSpec) -> list[VolumeDisk]:
        """Define and start a new domain, `spec`'s name, id, task, disk, serial log
        and SSH port, from the memory in a `save_state` file of another domain (on
        a host with no guest behind its domains, the test driver, it is created as
        `spec` says). The source's file stays; on failure nothing is left defined.

        Answers the volumes' disks (SPEC §18) the new domain holds, as the saved
        state had them: a read-only one on the volume's file, read-only; a writable
        one on a stand-in of its own (an empty file the volume's size, so no two
        domains write a volume), for the caller to unplug and remove."""
        ...

    def set_owner(self, name: str, task_id: str) -> None:
        """Make the domain's Rift metadata name `task_id` as its task.

        Its VM id, image and installation are kept; the running domain and its
        persistent definition both change, and `list_domains` shows the new task.
        """
        ...

    def attach_disk(self, name: str, disk: VolumeDisk) -> None:
        """Hot-plug `disk` into the running domain, and into its definition, so a
        pause or sleep keeps it (on a host with no guest behind its domains, the
        test driver, nothing is plugged). HypervisorError(op="attach")."""
        ...

    def detach_disk(self, name: str, disk: VolumeDisk) -> None:
        """Unplug `disk` from the domain and its definition; a domain without it (or
        none at all) is fine. HypervisorError(op="detach")."""
        ...

    def stats(self) -> dict[str, DomainStats]:
        """What each running domain uses now, by domain name (one call for all)."""
        ...

    def migrate(self, name: str, dest_uri: str, dest_address: str,
                dest_xml: str | None = None, copy_volumes: bool = False) -> None:
        """Move a running domain, live, to the host at `dest_uri`: QEMU streams its
        memory (and its own disk's blocks; with `copy_volumes` its writable volumes'
        too, onto the empty overlays made there) straight to `dest_address` there;
        the domain is then defined there and undefined here. `dest_xml`: its
        definition there (another SSH port). On failure it runs here as before
        (HypervisorError(op="migrate"))."""
        ...

    def domain_xml(self, name: str) -> str:
        """The running domain's XML as libvirt has it (for a migration's dest XML)."""
        ...

    def versions(self) -> str:
        """The host's libvirt and hypervisor versions, as one short stable string.

        It changes when either is upgraded: a saved or pooled VM made under other
        versions is to be rebuilt.
        """
        ...

    def close(self) -> None:
        """Let go of the connection; a later call opens it again."""
        ...


def unplug_volumes(hv: Hypervisor, name: str, held: list[VolumeDisk]) -> None:
    """A VM started from a saved state (an image of a snapshot) gets none of the
    volumes the state held (SPEC §18): each is unplugged, a stand-in removed."""
    for disk in held:
        hv.detach_disk(name, disk)
        if not disk.read_only:
            with contextlib.suppress(OSError):
                hv.disk.remove(disk.path)
