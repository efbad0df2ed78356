"""The one place that wires Rift together. Nothing here runs at import time."""

from __future__ import annotations

import contextlib
import grp
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypervisor import Hypervisor, open_hypervisor
from hypervisor.base import QEMU_USER, CpuLimits
from hypervisor.exec_helper import exec_helper
from hypervisor.volumes import PARENTS, VolumeFolder
from rift.catalog import DirectoryImages
from rift.config import Settings
from rift.domain.clock import Clock, SystemClock
from rift.domain.errors import InvalidArgument
from rift.domain.leases import LeaseRules
from rift.domain.store_errors import DuplicateKey
from rift.guest.adapter import guests_of
from rift.guest.code import SshCode
from rift.guest.connections import ShellSettings
from rift.guest.host_files import RemoteFiles, host_disk
from rift.guest.host_volume_content import HostVolumeContent
from rift.guest.host_volumes import HostVolumes
from rift.guest.links import HostLinks
from rift.guest.mounts import SshMounts
from rift.guest.routes import Routes
from rift.guest.shell import SshGuestShell
from rift.guest.trust import GuestCa, GuestCaError, load_guest_ca
from rift.logs import setup_logging
from rift.services.access import accounts
from rift.services.context import Deps, ExposureUrls, GuestRuntime, Limits
from rift.services.operator import hosts
from rift.services.ports import HostPool
from rift.store.migrate import upgrade_if_behind
from rift.store.sql import SqlStore


class CachedHostPool:
    """One hypervisor connection per URI, opened on first use, shared by threads."""

    def __init__(self, opener: Callable[[str], Hypervisor] = open_hypervisor) -> None:
        self._opener = opener
        self._open: dict[str, Hypervisor] = {}
        self._lock = threading.Lock()

    def hypervisor(self, uri: str) -> Hypervisor:
        with self._lock:
            if uri not in self._open:
                self._open[uri] = self._opener(uri)
            return self._open[uri]

    def close(self) -> None:
        with self._lock:
            for hv in self._open.values():
                hv.close()
            self._open.clear()


def lease_rules_of(settings: Settings) -> LeaseRules:
    return LeaseRules(settings.activity_step_s, settings.lease_quiet_s, settings.task_idle_s)


def limits_of(settings: Settings) -> Limits:
    return Limits(settings.max_open_tasks, settings.max_vms_per_task,
                  settings.rate_task_new_per_h, settings.rate_vm_new_per_h,
                  settings.closed_retention_s, settings.cpu_overcommit,
                  settings.vm_creating_grace_s, settings.exec_wait_s,
                  settings.exec_output_mib, settings.max_snapshots_per_task,
                  settings.host_lost_s,
                  max_disk_gib_per_user=settings.max_disk_gib_per_user,
                  host_disk_reserve_gib=settings.host_disk_reserve_gib,
                  rate_exec_new_per_h=settings.rate_exec_new_per_h,
                  rate_stale_per_h=settings.rate_stale_per_h,
                  task_sleep_s=settings.task_sleep_s)


def build_deps(settings: Settings, *, clock: Clock | None = None,
               host_pool: HostPool | None = None, migrate: bool = True) -> Deps:
    """Open the store (migrating it to the current schema) and the host pool,
    and make sure the `local` host exists."""
    setup_logging(settings.log_level)
    guest_ca = guest_ca_of(settings)  # refused before anything starts
    url = settings.resolved_database_url()
    if migrate:
        upgrade_if_behind(url)
    seal_data_dir(settings.data_dir)
    links = HostLinks()
    cpu = CpuLimits(settings.vm_cpu_weight, settings.vm_cpu_quota)
    pool = host_pool or CachedHostPool(
        lambda uri: open_hypervisor(uri, disk=host_disk(links, uri), cpu=cpu))
    store = SqlStore(url)
    with store.read() as tx:
        install_id = tx.meta.get("install_id")
    runtime = guest_runtime(settings, install=install_id)

    def host_uri(name: str) -> str | None:
        with store.read() as tx:
            found = tx.hosts.get(name)
        return found.uri if found is not None else None

    shell = SshGuestShell(
        private_dir(settings.data_dir / "keys"),
        ShellSettings(serial_dir=runtime.serial_dir,
                      egress_proxy_port=settings.egress_proxy_port or None,
                      helper_slack_s=settings.helper_slack_s,
                      console_cap_bytes=(settings.console_log_mib << 20
                                         if settings.console_log_mib else None),
                      guest_ca=guest_ca),
        routes=Routes(links, host_uri),
        helper_binary=lambda: exec_helper(runtime.images_dir / ".cache" / "helpers"))
    deps = Deps(
        exposure_urls=ExposureUrls(settings.public_url or ExposureUrls.public_url,
                                   settings.preview_domain),
        store=store,
        install_id=install_id,
        clock=clock or SystemClock(),
        hosts=pool,
        images=DirectoryImages(settings.data_dir / "images"),
        lease_rules=lease_rules_of(settings),
        limits=limits_of(settings),
        guests=guests_of(shell, links),
        runtime=runtime,
        default_image=settings.default_image,
        default_egress=settings.default_egress,
        host_files=RemoteFiles(links, runtime.serial_dir, runtime.vm_disks_dir),
        volume_files=HostVolumes(VolumeFolder(qemu_dir(settings.data_dir / "volumes")), links),
        mounts=SshMounts(shell),
        volume_content=HostVolumeContent(links, settings.data_dir / "tools"),
        code=SshCode(shell.files, shell.runner),
    )
    qemu_dir(settings.data_dir / "volumes" / PARENTS)
    hosts.ensure_local_host(deps, settings.hypervisor_uri, settings.host_vcpus,
                            settings.host_memory_mib)
    return deps


def guest_ca_of(settings: Settings) -> GuestCa | None:
    """RIFT_GUEST_CA_FILE's certificates, None when unset; `invalid_argument` naming
    the setting when the file is missing or holds no PEM certificate."""
    if settings.guest_ca_file is None:
        return None
    try:
        return load_guest_ca(settings.guest_ca_file)
    except GuestCaError as exc:
        raise InvalidArgument("RIFT_GUEST_CA_FILE", str(exc)) from None


def guest_runtime(settings: Settings, *, make_dirs: bool = True,
                  install: str | None = None) -> GuestRuntime:
    """Where real guests' files live and how they boot; `make_dirs` makes the
    private folders for serial logs and disks (`rift doctor` only looks)."""
    made = private_dir if make_dirs else (lambda path: path)
    return GuestRuntime(
        images_dir=settings.data_dir / "images",
        serial_dir=made(settings.data_dir / "serial"),
        disks_dir=(qemu_dir if make_dirs else made)(settings.data_dir / "disks"),
        boot_timeout_s=settings.vm_boot_timeout_s,
        accel=Accelerators(settings.data_dir / "images", install),
    )


def seal_data_dir(data_dir: Path) -> None:
    """Rift's own files 0600 in 0700 folders (SPEC §15): its SQLite database and the
    files SQLite keeps beside it (made with the database's own mode from then on);
    keys are made so (rift.guest.keys). The data dir itself is 0700, or, where QEMU
    runs as its own user, a folder QEMU only passes through (`qemu_dir`)."""
    qemu_dir(data_dir)
    for name in ("rift.db", "rift.db-wal", "rift.db-shm", "rift.db-journal"):
        with contextlib.suppress(FileNotFoundError):
            (data_dir / name).chmod(0o600)


def qemu_gid() -> int | None:
    """The group of QEMU's own user (QEMU_USER) on this machine; None where there is
    none (QEMU runs as root, or not here at all)."""
    try:
        return grp.getgrnam(QEMU_USER).gr_gid
    except KeyError:
        return None


def qemu_dir(path: Path) -> Path:
    """A folder QEMU passes through on the way to its files (the data dir, the VMs'
    disks): Rift's (0700), save that where QEMU runs as its own user its group may
    pass (0710, group rift-qemu: no listing, nothing for anyone else)."""
    private_dir(path)
    gid = qemu_gid()
    if gid is not None:
        try:
            os.chown(path, -1, gid)
        except PermissionError:  # not root and not in that group: QEMU is not ours here
            return path
        path.chmod(0o710)
    return path


def private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


class Accelerators:
    """`kvm` where a real boot under KVM works on that host, else `qemu` (TCG);
    probed once per URI (and cached on disk by the probe)."""

    def __init__(self, images_dir: Path, install: str | None = None) -> None:
        self.images_dir = images_dir
        self.install = install  # marks the probe's guest, so reconciliation finds a leaked one
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def verdict(self, uri: str) -> tuple[str, str]:
        from hypervisor.base import ImageError
        from hypervisor.image_files import image_files
        from hypervisor.kvm import probe_accel

        try:
            image = image_files(self.images_dir, "tiny")
        except ImageError:
            return "qemu", "no tiny image to probe KVM with (rift image build tiny); TCG"
        return probe_accel(image, uri, install=self.install)

    def __call__(self, uri: str) -> str:
        with self._lock:
            if uri not in self._known:
                self._known[uri] = self.verdict(uri)[0]
            return self._known[uri]


def close_deps(deps: Deps) -> None:
    deps.guests.lifecycle.close()
    deps.hosts.close()
    deps.store.close()


@dataclass(frozen=True)
class FirstAdmin:
    password: str
    token: str


def ensure_admin(deps: Deps) -> FirstAdmin | None:
    """On an empty database: the user `admin` with a random password and a token,
    answered once for printing; never stored in the clear."""
    with deps.store.read() as tx:
        if tx.users.count() > 0:
            return None
    password = secrets.token_urlsafe(18)
    try:
        accounts.add_user(deps, "admin", password)
    except (InvalidArgument, DuplicateKey):  # another replica made it first
        return None
    made = accounts.new_token(deps, "admin", "admin")
    return FirstAdmin(password, made.token.value)
