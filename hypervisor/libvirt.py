"""The real hypervisor adapter: one libvirt connection per host URI.

The only module that imports libvirt. Every libvirt call runs inside
`_translated(op)`, the one place libvirtError becomes HypervisorError.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import libvirt

from hypervisor.base import (
    CpuLimits,
    DomainRecord,
    DomainSpec,
    DomainStats,
    HostInfo,
    HypervisorError,
    ImageError,
    VolumeDisk,
    unplug_volumes,
)
from hypervisor.domain_xml import (
    RIFT_XMLNS,
    build_domain_xml,
    domain_xml_with_task,
    parse_rift_mark,
    rift_mark_with_task,
)
from hypervisor.fork_xml import (
    ForkDomain,
    fork_domain_xml,
    migrated_disks,
    volume_disks,
    with_volume_sources,
)
from hypervisor.host_disk import LOCAL_DISK, HostDisk
from hypervisor.save_image import (
    fork_copy_path,
    read_save_header,
    stand_in_path,
    write_fork,
)
from hypervisor.volumes import disk_xml, make_stand_in, without_volume_chains

log = logging.getLogger(__name__)

# Tried in order: drivers refuse flags they do not know (the test driver knows
# only the first two), and the qemu driver wants NVRAM to remove a UEFI varstore.
_UNDEFINE_FLAGS = (
    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
    | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM,
    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA,
    0,
)
_FLAGS_REFUSED = frozenset({libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT})
_RIFT_PREFIX = "rift"
# qemu.conf's user and group as libvirt's capabilities show them (its DAC driver's)
_DAC_BASE = re.compile(r"<model>dac</model>.*?<baselabel type='(?:kvm|qemu)'>\+(\d+):",
                       re.DOTALL)
_METADATA_UNSUPPORTED = frozenset(
    {libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED, libvirt.VIR_ERR_INVALID_ARG}
)


@functools.cache
def _quiet_libvirt() -> None:
    """Stop libvirt printing every error on stderr; we raise them instead.

    Process-wide, done once at the first open (a racing second call is harmless).
    """
    libvirt.registerErrorHandler(_ignore_error, None)


def _ignore_error(_ctx: object, _err: object) -> None:
    return None


def _no_cpu_cgroup(err: HypervisorError) -> bool:
    """Whether libvirt refused a domain's `<cputune>` for want of a cpu cgroup
    ("cgroup cpu is required for scheduler tuning", "CPU tuning is not available
    on this host")."""
    return err.code == libvirt.VIR_ERR_CONFIG_UNSUPPORTED and (
        "cgroup" in str(err) or "tuning" in str(err))


def _held(dom: Any, flag: int, serial: str, name: str) -> list[VolumeDisk]:
    """The disks with `serial` that the running domain (`flag` AFFECT_LIVE) or its
    definition (AFFECT_CONFIG) holds."""
    xml = str(dom.XMLDesc(0 if flag == libvirt.VIR_DOMAIN_AFFECT_LIVE
                          else libvirt.VIR_DOMAIN_XML_INACTIVE))
    try:
        return [d for d in volume_disks(xml) if d.serial == serial]
    except ValueError as exc:
        raise HypervisorError("detach", f"{name}: {exc}") from exc


@contextmanager
def _translated(op: str) -> Iterator[None]:
    """Turn libvirtError into HypervisorError carrying libvirt's own words."""
    try:
        yield
    except libvirt.libvirtError as exc:
        message = exc.get_error_message() or str(exc)
        raise HypervisorError(op, str(message), exc.get_error_code()) from exc


_LIVE_AND_CONFIG = libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
UNPLUG_WAIT_S = 20.0  # a guest's unplug of a volume's disk: some 0.3 s here under TCG
UNPLUG_POLL_S = 0.1


class LibvirtHypervisor:
    """A Hypervisor over one libvirt URI; safe to share between threads.

    The connection opens on first use and reopens when libvirt says it is no
    longer alive (for a remote URI, once a call has failed on the dead socket:
    that call raises, the next one reconnects). libvirt connections are
    themselves thread-safe, so calls run outside our lock.
    With validate=True every define is checked against libvirt's schema
    (about 5 ms each). `cpu`: the CPU limits of every guest it starts (`<cputune>`);
    a host whose libvirt has no cpu cgroup to apply them with refuses them, and
    then its guests start without them (said once in the log).
    """

    def __init__(
        self,
        uri: str,
        *,
        validate: bool = False,
        opener: Callable[[str], Any] | None = None,
        disk: HostDisk = LOCAL_DISK,
        cpu: CpuLimits | None = None,
    ) -> None:
        self.uri = uri
        self.disk = disk  # the files of the machine this libvirt runs on
        self.cpu = cpu or None  # None once the host has refused them
        self._validate = validate
        self._opener: Callable[[str], Any] = opener or libvirt.open
        self._lock = threading.Lock()
        self._qemu_uid: int | None = None
        self._conn: Any = None
        self._undefine_from = 0  # index into _UNDEFINE_FLAGS of the first accepted set
        self.unplug_wait_s = UNPLUG_WAIT_S

    def _connection(self) -> Any:
        with self._lock:
            conn = self._conn
            if conn is not None:
                try:
                    with _translated("open"):
                        alive = conn.isAlive() == 1
                except HypervisorError:
                    alive = False
                if alive:
                    return conn
                log.warning("libvirt connection to %s died; reopening", self.uri)
                self._conn = None
                _close_quietly(conn)
            _quiet_libvirt()
            with _translated("open"):
                conn = self._opener(self.uri)
            self._conn = conn
            return conn

    def info(self) -> HostInfo:
        conn = self._connection()
        with _translated("info"):
            node = conn.getInfo()
            driver = str(conn.getType()).lower()
        return HostInfo(driver=driver, vcpus=int(node[2]), memory_mib=int(node[1]))

    def create(self, spec: DomainSpec) -> None:
        if spec.restore_from is not None:
            held = self.fork_state(spec.restore_from, replace(spec, restore_from=None))
            unplug_volumes(self, spec.name, held)
            return
        if spec.proxied and spec.qemu_uid is None:
            spec = replace(spec, qemu_uid=self.qemu_uid())
        if spec.cpu is None and spec.domain_type != "test" and self.cpu is not None:
            try:
                self._create(replace(spec, cpu=self.cpu))
                return
            except HypervisorError as err:
                if not _no_cpu_cgroup(err):
                    raise
            log.warning("%s cannot limit its guests' CPU (libvirt has no cpu cgroup "
                        "there; qemu.conf's cgroup_controllers): they start without "
                        "limits", self.uri)
            self.cpu = None
        self._create(spec)

    def _create(self, spec: DomainSpec) -> None:
        xml = build_domain_xml(spec)
        conn = self._connection()
        flags = libvirt.VIR_DOMAIN_DEFINE_VALIDATE if self._validate else 0
        with _translated("define"):
            dom = conn.defineXMLFlags(xml, flags)
        try:
            with _translated("start"):
                dom.create()
        except BaseException:
            try:
                self._remove(dom)
            except HypervisorError as cleanup:
                # The domain carries Rift metadata, so the reconciler finds it later.
                log.error("could not undo failed start of %s: %s", spec.name, cleanup)
            raise

    def qemu_uid(self) -> int:
        """The uid QEMU runs as on this host: qemu.conf's `user`, from the DAC base
        label libvirt's capabilities show (`+uid:+gid`); HypervisorError when the host
        shows none (a driver without DAC, such as test:///, has no QEMU to run)."""
        if self._qemu_uid is None:
            conn = self._connection()
            with _translated("capabilities"):
                caps = str(conn.getCapabilities())
            found = _DAC_BASE.search(caps)
            if found is None:
                raise HypervisorError("capabilities", "the host names no DAC base label "
                                      "(the user QEMU runs as): an allowlisted guest "
                                      "cannot be given its QEMU user there")
            self._qemu_uid = int(found.group(1))
        return self._qemu_uid

    def destroy(self, name: str) -> bool:
        try:
            dom = self._domain("destroy", name)
        except HypervisorError as err:
            if err.code == libvirt.VIR_ERR_NO_DOMAIN:
                return False
            raise
        self._remove(dom)
        return True

    def _domain(self, op: str, name: str) -> Any:
        conn = self._connection()
        with _translated(op):
            return conn.lookupByName(name)

    def save(self, name: str) -> None:
        dom = self._domain("save", name)
        with _translated("save"):
            dom.managedSave(0)

    def restore(self, name: str) -> None:
        dom = self._domain("restore", name)
        with _translated("restore"):
            if dom.isActive():
                raise HypervisorError("restore", f"domain '{name}' is running, not saved")
            if not dom.hasManagedSaveImage(0):
                raise HypervisorError("restore", f"domain '{name}' has no saved state")
            # Starting a domain with a managed save image restores from it (and
            # libvirt deletes the image once the domain runs).
            dom.create()

    def save_state(self, name: str, path: str) -> None:
        dom = self._domain("save", name)
        with _translated("save"):
            dom.save(path)

    def restore_state(self, path: str) -> None:
        conn = self._connection()
        with _translated("restore"):
            try:
                xml = str(conn.saveImageGetXMLDesc(path, libvirt.VIR_DOMAIN_SAVE_IMAGE_XML_SECURE))
            except libvirt.libvirtError as err:
                if err.get_error_code() not in _FLAGS_REFUSED:  # the test driver's image
                    raise
                xml = ""
            fresh = without_volume_chains(xml)
            if fresh != xml:
                conn.restoreFlags(path, fresh, 0)
            else:
                conn.restore(path)

    def fork_state(self, path: str, spec: DomainSpec) -> list[VolumeDisk]:
        conn = self._connection()
        with _translated("fork"):
            driver = str(conn.getType()).lower()
        if driver == "test":  # no guest memory to carry: a domain like any other
            self.create(spec)
            return []
        try:
            saved = read_save_header(path, self.disk)
            if spec.serial_log is None or spec.ssh_port is None:
                raise ValueError("a fork needs a serial log and an SSH port")
            xml = fork_domain_xml(saved.xml, ForkDomain(
                name=spec.name, uuid=str(uuid.uuid4()), vm_id=spec.vm_id, task_id=spec.task_id,
                disk=spec.disk, serial_log=spec.serial_log, ssh_port=spec.ssh_port,
                seed=spec.seed, install=spec.install))
            held = volume_disks(xml)
            stand_ins: dict[str, str] = {}
            for disk in held:  # a volume written: never opened by two domains for writing
                if not disk.read_only:
                    stand_ins[disk.serial] = stand_in_path(disk.path, spec.name, disk.target)
                    make_stand_in(disk.path, stand_ins[disk.serial], self.disk)
            xml = without_volume_chains(with_volume_sources(xml, stand_ins))
        except (OSError, ValueError, ImageError) as exc:
            raise HypervisorError("fork", f"the saved state cannot be forked: {exc}") from exc
        forked = fork_copy_path(path, spec.name)
        try:
            write_fork(path, forked, xml, self.disk)
        except (OSError, ValueError) as exc:
            raise HypervisorError("fork", f"could not write the fork's state: {exc}") from exc
        try:
            with _translated("define"):
                # Defined first, the restore runs into it: the fork is persistent.
                dom = conn.defineXML(xml)
            try:
                with _translated("restore"):
                    conn.restore(forked)
            except BaseException:
                try:
                    self._remove(dom)
                except HypervisorError as cleanup:
                    log.error("could not undo a failed fork of %s: %s", spec.name, cleanup)
                raise
        except BaseException:
            for stand_in in stand_ins.values():
                with contextlib.suppress(OSError):
                    self.disk.remove(stand_in)
            raise
        finally:
            with contextlib.suppress(OSError):
                self.disk.remove(forked)
        return [replace(d, path=stand_ins.get(d.serial, d.path)) for d in held]

    def set_owner(self, name: str, task_id: str) -> None:
        dom = self._domain("set_owner", name)
        try:
            with _translated("set_owner"):
                current = str(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, RIFT_XMLNS, 0))
        except HypervisorError as err:
            if err.code != libvirt.VIR_ERR_NO_DOMAIN_METADATA:
                raise
            raise HypervisorError("set_owner", f"domain '{name}' carries no Rift metadata",
                                  err.code) from err
        try:
            mark = rift_mark_with_task(current, task_id)
        except ValueError as exc:
            raise HypervisorError("set_owner", f"domain '{name}': {exc}") from exc
        for attempt in (1, 2):
            try:
                with _translated("set_owner"):
                    # LIVE on a stopped domain, or CONFIG alone on a running one,
                    # would leave the other copy naming the old task.
                    if dom.isActive():
                        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
                        if dom.isPersistent():
                            flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
                    else:
                        flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
                    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, mark, _RIFT_PREFIX,
                                    RIFT_XMLNS, flags)
                break
            except HypervisorError as err:
                # Started or stopped between the look and the change: look again.
                if attempt == 2 or err.code != libvirt.VIR_ERR_OPERATION_INVALID:
                    raise
        if not (flags & libvirt.VIR_DOMAIN_AFFECT_LIVE):
            self._set_saved_owner(dom, task_id)

    def _set_saved_owner(self, dom: Any, task_id: str) -> None:
        """Rewrite the task in a managed save image's own XML, which a restore runs."""
        try:
            with _translated("set_owner"):
                if not dom.hasManagedSaveImage(0):
                    return
                xml = str(dom.managedSaveGetXMLDesc(libvirt.VIR_DOMAIN_SAVE_IMAGE_XML_SECURE))
        except HypervisorError as err:
            if err.code in _FLAGS_REFUSED:  # the test driver keeps no XML in its image
                return
            raise
        try:
            saved = domain_xml_with_task(xml, task_id)
        except ValueError as exc:
            raise HypervisorError("set_owner", f"its saved state: {exc}") from exc
        with _translated("set_owner"):
            dom.managedSaveDefineXML(saved, 0)

    def attach_disk(self, name: str, disk: VolumeDisk) -> None:
        dom = self._domain("attach", name)
        with _translated("attach"):
            if not dom.isActive():
                raise HypervisorError("attach", f"domain '{name}' is not running")
            if str(self._connection().getType()).lower() == "test":
                return  # no guest to plug it into: the test driver cannot hot-plug
            dom.attachDeviceFlags(disk_xml(disk), _LIVE_AND_CONFIG)

    def detach_disk(self, name: str, disk: VolumeDisk) -> None:
        try:
            dom = self._domain("detach", name)
        except HypervisorError as err:
            if err.code == libvirt.VIR_ERR_NO_DOMAIN:
                return
            raise
        with _translated("detach"):
            if str(self._connection().getType()).lower() == "test":
                return
            # The running domain and its definition each unplug the disk they hold
            # with that serial, under the target they hold it at: a live unplug the
            # guest finished late, or a definition written apart, may leave one
            # without it, or with it at another target.
            flags = [libvirt.VIR_DOMAIN_AFFECT_CONFIG]
            if dom.isActive():
                flags.insert(0, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            for flag in flags:
                for found in _held(dom, flag, disk.serial, name):
                    try:
                        dom.detachDeviceFlags(disk_xml(found), flag)
                    except libvirt.libvirtError as exc:
                        # Gone meanwhile (libvirt removes a device when the guest's
                        # unplug of it lands, which may be late): what was asked.
                        if (exc.get_error_code() != libvirt.VIR_ERR_DEVICE_MISSING
                                or found in _held(dom, flag, disk.serial, name)):
                            raise
                        log.warning("%s: the disk %s was gone when unplugged", name,
                                    found.target)
                if flag == libvirt.VIR_DOMAIN_AFFECT_LIVE:
                    self._until_released(dom, disk.serial, name)

    def _until_released(self, dom: Any, serial: str, name: str) -> None:
        """Wait until the running domain no longer holds the disk `serial`: libvirt
        answers a live unplug after 5 s even when the guest has not let go yet, and
        a detach must not answer while QEMU still has the file open (or free its
        target for the next attach)."""
        deadline = time.monotonic() + self.unplug_wait_s
        while held := _held(dom, libvirt.VIR_DOMAIN_AFFECT_LIVE, serial, name):
            if time.monotonic() >= deadline:
                raise HypervisorError("detach", f"{name}: the guest did not let go of its "
                                      f"disk {held[0].target} within {self.unplug_wait_s:g}"
                                      " s; call again")
            time.sleep(UNPLUG_POLL_S)

    def stats(self) -> dict[str, DomainStats]:
        conn = self._connection()
        kinds = (libvirt.VIR_DOMAIN_STATS_CPU_TOTAL | libvirt.VIR_DOMAIN_STATS_BALLOON
                 | libvirt.VIR_DOMAIN_STATS_BLOCK)
        with _translated("stats"):
            found = conn.getAllDomainStats(kinds, libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE)
            return {str(dom.name()): domain_stats(values) for dom, values in found}

    def migrate(self, name: str, dest_uri: str, dest_address: str,
                dest_xml: str | None = None, copy_volumes: bool = False) -> None:
        """Peer to peer: this host's libvirtd opens `dest_uri` itself (over the hosts'
        SSH for qemu+ssh://). A guest with no disk to carry (kernel and initrd) goes
        tunnelled through that connection: its memory never crosses the network in
        clear and no migration port is opened. A guest with a disk (its own, or with
        `copy_volumes` its writable volumes): their blocks cannot go tunnelled (libvirt
        refuses NBD over a tunnel with this QEMU), so QEMU streams memory and disks to
        `dest_address` over libvirt's migration TLS (the hosts' certificates in
        /etc/pki/qemu), each disk's top layer only (its backing files, and a read-only
        volume, are there already); a host without them refuses, and the guest runs
        here as before."""
        dom = self._domain("migrate", name)
        with _translated("migrate"):
            xml = dom.XMLDesc(0)
        try:
            disks = migrated_disks(xml, copy_volumes)
        except ValueError as exc:
            raise HypervisorError("migrate", f"{name}: {exc}") from exc
        flags = (libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST
                 | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE | libvirt.VIR_MIGRATE_UNSAFE
                 | libvirt.VIR_MIGRATE_PEER2PEER)
        params: dict[str, Any] = {}
        if disks:  # on the host's own files: their blocks go along (NBD), in TLS
            flags |= libvirt.VIR_MIGRATE_NON_SHARED_INC | libvirt.VIR_MIGRATE_TLS
            params[libvirt.VIR_MIGRATE_PARAM_URI] = f"tcp://{dest_address}"
            params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = disks
        else:
            flags |= libvirt.VIR_MIGRATE_TUNNELLED
        if dest_xml is not None:
            params[libvirt.VIR_MIGRATE_PARAM_DEST_XML] = dest_xml
            params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = dest_xml
        with _translated("migrate"):
            dom.migrateToURI3(dest_uri, params, flags)

    def domain_xml(self, name: str) -> str:
        dom = self._domain("domain_xml", name)
        with _translated("domain_xml"):
            return str(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE))

    def versions(self) -> str:
        conn = self._connection()
        with _translated("versions"):
            lib = int(conn.getLibVersion())
            hv = int(conn.getVersion())
            driver = str(conn.getType()).lower()
        return f"libvirt {_dotted(lib)} {driver} {_dotted(hv)}"

    def _remove(self, dom: Any) -> None:
        """Stop a domain if it runs, then undefine it; tolerate losing a race."""
        try:
            with _translated("destroy"):
                if dom.isActive():
                    dom.destroy()
        except HypervisorError as err:
            if err.code == libvirt.VIR_ERR_NO_DOMAIN:
                return  # gone already (a transient domain, or another caller)
            if err.code != libvirt.VIR_ERR_OPERATION_INVALID:  # stopped meanwhile
                raise
        self._undefine(dom)

    def _undefine(self, dom: Any) -> None:
        index = self._undefine_from
        while True:
            flags = _UNDEFINE_FLAGS[index]
            try:
                with _translated("undefine"):
                    if not flags & libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE:
                        # libvirt refuses to undefine a domain that has saved state.
                        self._remove_saved_state(dom)
                    dom.undefineFlags(flags)
            except HypervisorError as err:
                if err.code == libvirt.VIR_ERR_NO_DOMAIN:
                    return
                if err.code in _FLAGS_REFUSED and index + 1 < len(_UNDEFINE_FLAGS):
                    index += 1
                    continue
                raise
            self._undefine_from = index
            return

    @staticmethod
    def _remove_saved_state(dom: Any) -> None:
        try:
            if dom.hasManagedSaveImage(0):
                dom.managedSaveRemove(0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
                raise

    def list_domains(self) -> list[DomainRecord]:
        conn = self._connection()
        with _translated("list"):
            domains = conn.listAllDomains(0)
        records = []
        for dom in domains:
            try:
                records.append(self._record(dom))
            except HypervisorError as err:
                if err.code != libvirt.VIR_ERR_NO_DOMAIN:  # vanished while we looked
                    raise
        return records

    def _record(self, dom: Any) -> DomainRecord:
        with _translated("list"):
            name = str(dom.name())
            active = bool(dom.isActive())
        saved = not active and self._saved(dom)
        task_id, vm_id, install = self._metadata(dom)
        return DomainRecord(name=name, task_id=task_id, vm_id=vm_id, active=active,
                            install=install, saved=saved)

    def _saved(self, dom: Any) -> bool:
        try:
            with _translated("list"):
                return bool(dom.hasManagedSaveImage(0))
        except HypervisorError as err:
            if err.code == libvirt.VIR_ERR_NO_SUPPORT:
                return False
            raise

    def _metadata(self, dom: Any) -> tuple[str | None, str | None, str | None]:
        try:
            with _translated("metadata"):
                element = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, RIFT_XMLNS, 0)
        except HypervisorError as err:
            if err.code == libvirt.VIR_ERR_NO_DOMAIN_METADATA:
                return None, None, None
            if err.code not in _METADATA_UNSUPPORTED:
                raise
            with _translated("metadata"):
                return parse_rift_mark(str(dom.XMLDesc(0)))
        return parse_rift_mark(str(element))

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)


def domain_stats(values: dict[str, Any]) -> DomainStats:
    """libvirt's typed statistics of one domain (virConnectGetAllDomainStats) as
    DomainStats: `cpu.time`, `balloon.rss`, and `block.<n>.allocation` of `vda`."""
    disk = None
    for index in range(int(values.get("block.count", 0))):
        if values.get(f"block.{index}.name") == "vda":
            allocation = values.get(f"block.{index}.allocation")
            disk = int(allocation) if allocation is not None else None
    cpu, rss = values.get("cpu.time"), values.get("balloon.rss")
    return DomainStats(cpu_time_ns=int(cpu) if cpu is not None else None,
                       memory_rss_kib=int(rss) if rss is not None else None,
                       disk_allocation_bytes=disk)


def _dotted(version: int) -> str:
    """libvirt's version number (major * 1,000,000 + minor * 1,000 + release) as text."""
    return f"{version // 1_000_000}.{version // 1000 % 1000}.{version % 1000}"


def _close_quietly(conn: Any) -> None:
    try:
        with _translated("close"):
            conn.close()
    except HypervisorError as err:
        log.debug("closing a libvirt connection: %s", err)
