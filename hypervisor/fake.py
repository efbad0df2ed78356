"""An in-memory Hypervisor for unit tests, with failures on demand.

Behaves like LibvirtHypervisor over the test driver: create renders the same
XML (so a bad spec raises the same ValueError), a refused create leaves
nothing, destroy is idempotent (and takes a saved state with it), save stops a
running domain and restore starts only a saved one, and no capacity is checked
(placement does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hypervisor.base import (
    DomainRecord,
    DomainSpec,
    DomainStats,
    HostInfo,
    HypervisorError,
    VolumeDisk,
    unplug_volumes,
)
from hypervisor.domain_xml import build_domain_xml, domain_xml_with_task
from hypervisor.host_disk import LOCAL_DISK, HostDisk

FAKE_VERSIONS = "libvirt 0.0.0 fake 0.0.0"


@dataclass
class FakeDomain:
    """A domain held by FakeHypervisor; tests may read and change it."""

    name: str
    task_id: str | None
    vm_id: str | None
    active: bool = True
    spec: DomainSpec | None = None  # None for a domain made behind Rift's back
    install: str | None = None  # a foreign domain's installation mark
    xml: str | None = None
    saved: bool = False  # stopped with a saved state (FakeHypervisor.save)
    disks: dict[str, VolumeDisk] = field(default_factory=dict)  # hot-plugged, by serial


class FakeHypervisor:
    """A Hypervisor in memory; safe to share between threads."""

    def __init__(self, uri: str = "fake:///", vcpus: int = 16, memory_mib: int = 32768) -> None:
        self.uri = uri
        self.disk: HostDisk = LOCAL_DISK
        self.vcpus = vcpus
        self.memory_mib = memory_mib
        self.domains: dict[str, FakeDomain] = {}
        self.calls: list[tuple[str, str]] = []  # (op, domain name), in order
        self.closed = False
        self._lock = threading.RLock()
        self._create_failures: list[str] = []
        self._destroy_failure: str | None = None
        self._failures: dict[str, list[str]] = {}  # op -> messages of its next calls
        self.version = FAKE_VERSIONS  # what versions() answers; tests change it
        self.states: dict[str, str] = {}  # save_state file -> the domain it saved
        self.state_disks: dict[str, dict[str, VolumeDisk]] = {}  # the volumes each held
        self.usage: dict[str, DomainStats] = {}  # what stats() answers per domain
        self.peers: Callable[[str], FakeHypervisor] | None = None  # migrate()'s other ends
        self.volumes_copied: list[str] = []  # the domains migrate() carried volumes of

    # failure injection

    def fail_next_create(self, message: str, times: int = 1) -> None:
        """The next `times` creates raise HypervisorError(message) and leave nothing."""
        with self._lock:
            self._create_failures.extend([message] * times)

    def fail_destroy(self, message: str | None) -> None:
        """Every destroy raises HypervisorError(message) until called with None."""
        with self._lock:
            self._destroy_failure = message

    def fail_next(self, op: str, message: str, times: int = 1) -> None:
        """The next `times` calls of `op` ("save", "restore", "set_owner") raise
        HypervisorError(op, message) and change nothing."""
        with self._lock:
            self._failures.setdefault(op, []).extend([message] * times)

    def add_foreign_domain(
        self, name: str, task_id: str | None, vm_id: str | None, active: bool = True,
        install: str | None = None,
    ) -> None:
        """A running domain made behind Rift's back (after a crash, or by hand)."""
        with self._lock:
            self.domains[name] = FakeDomain(name=name, task_id=task_id, vm_id=vm_id,
                                            active=active, install=install)

    # the Hypervisor protocol

    def info(self) -> HostInfo:
        with self._lock:
            self._touch("info", "")
            return HostInfo(driver="fake", vcpus=self.vcpus, memory_mib=self.memory_mib)

    def create(self, spec: DomainSpec) -> None:
        if spec.restore_from is not None:
            held = self.fork_state(spec.restore_from, replace(spec, restore_from=None))
            unplug_volumes(self, spec.name, held)
            return
        xml = build_domain_xml(spec)
        with self._lock:
            self._touch("create", spec.name)
            if spec.name in self.domains:
                raise HypervisorError(
                    "define", f"operation failed: domain '{spec.name}' already exists"
                )
            if self._create_failures:
                raise HypervisorError("start", self._create_failures.pop(0))
            self.domains[spec.name] = FakeDomain(
                name=spec.name, task_id=spec.task_id, vm_id=spec.vm_id, spec=spec, xml=xml
            )

    def destroy(self, name: str) -> bool:
        with self._lock:
            self._touch("destroy", name)
            if self._destroy_failure is not None:
                raise HypervisorError("destroy", self._destroy_failure)
            return self.domains.pop(name, None) is not None

    def list_domains(self) -> list[DomainRecord]:
        with self._lock:
            self._touch("list", "")
            return [
                DomainRecord(name=d.name, task_id=d.task_id, vm_id=d.vm_id, active=d.active,
                             install=d.spec.install if d.spec else d.install, saved=d.saved)
                for d in self.domains.values()
            ]

    def save(self, name: str) -> None:
        with self._lock:
            domain = self._domain("save", name)
            if not domain.active:
                raise HypervisorError("save", "Requested operation is not valid: "
                                      "domain is not running")
            domain.active, domain.saved = False, True

    def restore(self, name: str) -> None:
        with self._lock:
            domain = self._domain("restore", name)
            if domain.active:
                raise HypervisorError("restore", f"domain '{name}' is running, not saved")
            if not domain.saved:
                raise HypervisorError("restore", f"domain '{name}' has no saved state")
            domain.active, domain.saved = True, False

    def save_state(self, name: str, path: str) -> None:
        with self._lock:
            domain = self._domain("save", name)
            if not domain.active:
                raise HypervisorError("save", "Requested operation is not valid: "
                                      "domain is not running")
            domain.active = False
            self.states[path] = name
            self.state_disks[path] = dict(domain.disks)

    def restore_state(self, path: str) -> None:
        with self._lock:
            self._touch("restore", path)
            failures = self._failures.get("restore")
            if failures:
                raise HypervisorError("restore", failures.pop(0))
            name = self.states.get(path)
            domain = self.domains.get(name or "")
            if domain is None:
                raise HypervisorError("restore", f"cannot read the saved state {path}")
            if domain.active:
                raise HypervisorError("restore", f"domain '{name}' is already active")
            domain.active = True

    def fork_state(self, path: str, spec: DomainSpec) -> list[VolumeDisk]:
        with self._lock:
            failures = self._failures.get("fork")
            if failures:
                self._touch("fork", spec.name)
                raise HypervisorError("fork", failures.pop(0))
            if path not in self.states:
                raise HypervisorError("fork", f"cannot read the saved state {path}")
            held = [disk if disk.read_only else replace(
                disk, path=f"{path}.stand-in-{spec.name}-{disk.target}")
                for disk in self.state_disks.get(path, {}).values()]
        self.create(spec)
        with self._lock:
            self.domains[spec.name].disks = {disk.serial: disk for disk in held}
        return held

    def set_owner(self, name: str, task_id: str) -> None:
        with self._lock:
            domain = self._domain("set_owner", name)
            if domain.task_id is None and domain.vm_id is None:
                raise HypervisorError("set_owner", f"domain '{name}' carries no Rift metadata")
            if domain.xml is not None:
                try:
                    domain.xml = domain_xml_with_task(domain.xml, task_id)
                except ValueError as exc:
                    raise HypervisorError("set_owner", f"domain '{name}': {exc}") from exc
            domain.task_id = task_id

    def migrate(self, name: str, dest_uri: str, dest_address: str,
                dest_xml: str | None = None, copy_volumes: bool = False) -> None:
        """Moves the domain to the fake hypervisor `peers(dest_uri)` answers (tests
        set `peers`); injected failures leave it here."""
        with self._lock:
            domain = self._domain("migrate", name)
            if not domain.active or self.peers is None:
                raise HypervisorError("migrate", f"domain '{name}' cannot migrate")
            target = self.peers(dest_uri)
            del self.domains[name]
            if copy_volumes:
                self.volumes_copied.append(name)
        with target._lock:
            target.domains[name] = replace(domain, xml=dest_xml or domain.xml)

    def domain_xml(self, name: str) -> str:
        with self._lock:
            domain = self._domain("domain_xml", name)
            if domain.xml is not None:
                return domain.xml
            assert domain.spec is not None
            return build_domain_xml(domain.spec)

    def attach_disk(self, name: str, disk: VolumeDisk) -> None:
        with self._lock:
            dom = self._domain("attach", name)
            if not dom.active:
                raise HypervisorError("attach", f"domain '{name}' is not running")
            dom.disks[disk.serial] = disk

    def detach_disk(self, name: str, disk: VolumeDisk) -> None:
        with self._lock:
            self._touch("detach", name)
            failures = self._failures.get("detach")
            if failures:
                raise HypervisorError("detach", failures.pop(0))
            dom = self.domains.get(name)
            if dom is not None:
                dom.disks.pop(disk.serial, None)

    def stats(self) -> dict[str, DomainStats]:
        """Running domains use what `usage` says (tests set it), else nothing known."""
        with self._lock:
            self._touch("stats", "")
            failures = self._failures.get("stats")
            if failures:
                raise HypervisorError("stats", failures.pop(0))
            return {d.name: self.usage.get(d.name, DomainStats())
                    for d in self.domains.values() if d.active}

    def versions(self) -> str:
        with self._lock:
            self._touch("versions", "")
            return self.version

    def _domain(self, op: str, name: str) -> FakeDomain:
        """The named domain, after the call is recorded and any injected failure raised."""
        self._touch(op, name)
        failures = self._failures.get(op)
        if failures:
            raise HypervisorError(op, failures.pop(0))
        domain = self.domains.get(name)
        if domain is None:
            raise HypervisorError(op, f"Domain not found: no domain with matching name '{name}'")
        return domain

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def _touch(self, op: str, name: str) -> None:
        """Record a call; like the real adapter, a closed fake opens again on use."""
        self.calls.append((op, name))
        self.closed = False
