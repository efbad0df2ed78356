"""What every use case is given: the ports, the clock and the lease rules, the
limits, the caller."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rift.domain.clock import Clock
from rift.domain.leases import LeaseRules
from rift.domain.model import Egress
from rift.services.absent import (
    NoGuestMounts,
    NoHostFiles,
    NoRuntime,
    NoVolumeContent,
    NoVolumeFiles,
    no_guests,
)
from rift.services.ports import (
    GuestMounts,
    Guests,
    HostFiles,
    HostPool,
    ImageCatalog,
    Store,
    VolumeFiles,
)
from rift.services.ports.code import GuestCode, NoGuestCode
from rift.services.ports.volumes import VolumeContent


@dataclass(frozen=True)
class Limits:
    max_open_tasks: int = 32
    max_vms_per_task: int = 16
    rate_task_new_per_h: int = 120
    rate_vm_new_per_h: int = 240
    closed_retention_s: int = 30 * 24 * 3600
    cpu_overcommit: float = 4.0
    creating_grace_s: int = 600  # a row `creating` this old is a create that died
    exec_wait_s: int = 45
    exec_output_mib: int = 16
    max_snapshots_per_task: int = 8
    host_lost_s: int = 600  # a host unreachable this long: its VMs are failed (host lost)
    max_disk_gib_per_user: int = 200  # overlays, paused VMs' memory, snapshots (SPEC §15)
    host_disk_reserve_gib: int = 4  # a host with less disk free takes no new VM, snapshot
    rate_exec_new_per_h: int = 3600  # exec starts per user per hour (SPEC §15)
    rate_stale_per_h: int = 120  # stale-handle refusals that leave an event, per task per hour
    task_sleep_s: int = 900  # a task quiet this long puts its running VMs to sleep; 0 never


@dataclass
class Observers:
    """Callbacks the doors hang on the engine (metrics), without the engine
    knowing them."""

    # Told when a pool changed (a VM taken, a pool set): the pool filler wakes.
    pool_changes: list[Callable[[], None]] = field(default_factory=list)
    # (start kind, seconds from the call to running), for every VM that runs
    vm_start_seconds: list[Callable[[str, float], None]] = field(default_factory=list)

    def vm_started(self, kind: str, seconds: float) -> None:
        for observe in self.vm_start_seconds:
            observe(kind, seconds)

    def pools_changed(self) -> None:
        for wake in self.pool_changes:
            wake()


@dataclass
class Cursors:
    """Where each rotating scan of the background jobs goes on from (this process's)."""

    execs: str | None = None  # the sweep's running execs: the last id it looked at


class ExecsInFlight:
    """The execs a call of this process is waiting on in their guest (a start, a
    read): the sweep leaves them to that call, which records their end. Its own look
    would take a second connection to the guest, a new login while the guest runs
    the call's command (in a guest just woken, most of the exec's time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()

    @contextmanager
    def waiting_on(self, exec_id: str) -> Iterator[None]:
        with self._lock:
            self._calls[exec_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._calls[exec_id] -= 1
                if self._calls[exec_id] <= 0:
                    del self._calls[exec_id]

    def __contains__(self, exec_id: object) -> bool:
        with self._lock:
            return exec_id in self._calls


@dataclass
class DiskRoom:
    """Each host's free disk as last sampled (this process's; rift.services.background.usage)."""

    free: dict[str, int] = field(default_factory=dict)  # host name: bytes free

    def low(self, floor_bytes: int) -> dict[str, int]:
        """The hosts under `floor_bytes` (name: bytes free); a host not sampled yet is not."""
        return {name: free for name, free in self.free.items() if free < floor_bytes}


class Runtime(Protocol):
    """What the engine asks of the guest runtime: how long a boot may take, and the
    folders of images, snapshots and VMs' disks. Without real guests (libvirt's test
    driver, unit tests) rift.services.absent.NoRuntime answers: no images are kept,
    no snapshot has files, no disk is sampled."""

    @property
    def boot_timeout_s(self) -> float: ...
    def images(self, field: str) -> Path:
        """The images folder; InvalidArgument (naming `field`) without real guests."""
        ...
    def image_folder(self, image: str) -> Path | None:
        """The folder of `image`'s files; None without real guests."""
        ...
    def snapshot_folder(self, snapshot_id: str) -> Path | None:
        """Where the snapshot's files are; None without real guests."""
        ...
    def kept_folders(self) -> list[Path]:
        """The snapshots folder and the images folder (where forks' copies of saved
        states may be left); none without real guests."""
        ...
    def disk_folders(self) -> list[Path]:
        """Where VMs' disks are (a host's free disk is sampled there); none without."""
        ...


@dataclass(frozen=True)
class GuestRuntime:
    """What real guests need: where images, serial logs and the per-VM disks of
    qcow2 images live, how long a boot may take, and which accelerator each host
    URI uses (`kvm` or `qemu`)."""

    images_dir: Path
    serial_dir: Path
    boot_timeout_s: float
    accel: Callable[[str], str]
    disks_dir: Path | None = None  # default: `disks` beside `images_dir`

    @property
    def vm_disks_dir(self) -> Path:
        """Where each VM of a qcow2 image keeps its overlay and its cloud-init seed."""
        return self.disks_dir or self.images_dir.parent / "disks"

    @property
    def snapshots_dir(self) -> Path:
        """Where each snapshot keeps its saved memory and its copy of a VM's disk."""
        return self.images_dir.parent / "snapshots"

    def images(self, field: str) -> Path:
        return self.images_dir

    def image_folder(self, image: str) -> Path | None:
        return self.images_dir / image

    def snapshot_folder(self, snapshot_id: str) -> Path | None:
        return self.snapshots_dir / snapshot_id

    def kept_folders(self) -> list[Path]:
        return [self.snapshots_dir, self.images_dir]

    def disk_folders(self) -> list[Path]:
        return [self.vm_disks_dir]


@dataclass(frozen=True)
class ExposureUrls:
    """Where exposures are reached (SPEC §13): `public_url` + `/x/<secret>/`, or
    `https://<secret>.<preview_domain>/` when a preview domain is set."""

    public_url: str = "http://127.0.0.1:8080"
    preview_domain: str | None = None

    def url(self, secret: str) -> str:
        if self.preview_domain:
            return f"https://{secret}.{self.preview_domain}/"
        return f"{self.public_url.rstrip('/')}/x/{secret}/"


@dataclass(frozen=True)
class Deps:
    store: Store
    clock: Clock
    hosts: HostPool
    images: ImageCatalog
    lease_rules: LeaseRules = field(default_factory=LeaseRules)
    limits: Limits = field(default_factory=Limits)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("rift"))
    # the guest ports; none of them reaches a guest unless rift.bootstrap wires them
    guests: Guests = field(default_factory=no_guests)
    observers: Observers = field(default_factory=Observers)
    cursors: Cursors = field(default_factory=Cursors)
    execs_in_flight: ExecsInFlight = field(default_factory=ExecsInFlight)
    disk_room: DiskRoom = field(default_factory=DiskRoom)
    # real guests' folders and boot wait; none unless rift.bootstrap wires them
    runtime: Runtime = field(default_factory=NoRuntime)
    install_id: str | None = None  # marks this control plane's domains on shared hosts
    default_image: str = "debian"  # of a `rift_vm_new` that names none (RIFT_DEFAULT_IMAGE)
    exposure_urls: ExposureUrls = field(default_factory=ExposureUrls)
    default_egress: Egress = "open"  # of a `rift_vm_new` that names none (RIFT_DEFAULT_EGRESS)
    # a domain's files onto a host elsewhere; without SSH to hosts, nothing is put there
    host_files: HostFiles = field(default_factory=NoHostFiles)
    # volumes' files on their hosts and their mounts in guests (SPEC §18); none unless
    # rift.bootstrap wires them
    volume_files: VolumeFiles = field(default_factory=NoVolumeFiles)
    mounts: GuestMounts = field(default_factory=NoGuestMounts)
    volume_content: VolumeContent = field(default_factory=NoVolumeContent)  # E2B's content API
    # the guests' code contexts (SPEC §20); none unless rift.bootstrap wires them
    code: GuestCode = field(default_factory=NoGuestCode)


@dataclass(frozen=True)
class Caller:
    """Who calls: the user a token names, the holder label people read, and whether
    the token is an operator's (`rift token new USER --operator`: it reads every
    user's VMs in /metrics)."""

    user: str
    label: str
    operator: bool = False


OPERATOR = "operator"
SWEEP = "sweep"
