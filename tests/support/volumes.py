"""Fakes of the volumes' ports (their files, their mounts in a guest) and the steps
the volume tests share: a VM with a guest to mount in, a volume, an attach."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.errors import InvalidArgument
from rift.domain.model import Vm
from rift.services.context import Deps
from rift.services.lifecycle import tasks, vms, volume_attach, volumes
from rift.services.operator import hosts
from rift.services.operator.hosts import HostSize
from tests.support.engine import ALICE
from tests.support.vm_rows import give_ssh_address


@dataclass
class Files:
    made: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    used: dict[str, int] = field(default_factory=dict)  # what used_bytes answers
    kept: dict[str, dict[str, int]] = field(default_factory=dict)  # snapshot: volume: GiB

    def used_bytes(self, uri: str, volume_id: str) -> int | None:
        return self.used.get(volume_id)

    def send(self, uri: str, dest_uri: str, volume_id: str, whole: bool) -> None:
        self.calls.append(("send", volume_id, uri, dest_uri, "whole" if whole else "top"))

    def path(self, uri: str, volume_id: str) -> str:
        return f"/volumes/{volume_id}.qcow2"

    def make(self, uri: str, volume_id: str, size_gib: int) -> None:
        self.made[volume_id] = size_gib
        self.calls.append(("make", volume_id))

    def grow(self, uri: str, volume_id: str, size_gib: int) -> None:
        self.made[volume_id] = size_gib
        self.calls.append(("grow", volume_id))

    def clone(self, uri: str, source_id: str, volume_id: str) -> None:
        self.made[volume_id] = self.made[source_id]
        self.calls.append(("clone", source_id, volume_id))

    def remove(self, uri: str, volume_id: str) -> None:
        self.made.pop(volume_id)
        self.calls.append(("remove", volume_id))

    def freeze(self, uri: str, volume_id: str, snapshot_id: str) -> None:
        self.kept.setdefault(snapshot_id, {})[volume_id] = self.made[volume_id]
        self.calls.append(("freeze", volume_id, snapshot_id))

    def frozen(self, uri: str, snapshot_id: str) -> dict[str, int]:
        return dict(sorted(self.kept.get(snapshot_id, {}).items()))

    def clone_frozen(self, uri: str, snapshot_id: str, source_id: str,
                     volume_id: str) -> None:
        self.made[volume_id] = self.kept[snapshot_id][source_id]
        self.calls.append(("clone_frozen", snapshot_id, source_id, volume_id))

    def thaw(self, uri: str, snapshot_id: str) -> None:
        self.kept.pop(snapshot_id, None)
        self.calls.append(("thaw", snapshot_id))


@dataclass
class Mounts:
    mounted: dict[tuple[str, str], tuple[str, bool]] = field(default_factory=dict)
    refuse: bool = False
    flushed: list[tuple[str, ...]] = field(default_factory=list)  # (VM id, paths...)

    def mount(self, vm: Vm, serial: str, path: str, read_only: bool) -> None:
        if self.refuse:
            raise InvalidArgument("path", f"{path}: the guest could not mount the volume")
        self.mounted[(vm.id, path)] = (serial, read_only)

    def unmount(self, vm: Vm, path: str) -> None:
        self.mounted.pop((vm.id, path), None)

    def flush(self, vm: Vm, paths: list[str]) -> None:
        self.flushed.append((vm.id, *paths))


def new_vm(deps: Deps, caller: object = ALICE) -> tuple[str, str, str]:
    opened = tasks.new(deps, caller, command(c.TaskNewIn))  # type: ignore[arg-type]
    handle = str(opened.handle)
    vm = vms.new(deps, caller, command(c.VmNewIn, handle=handle, image="tiny")).vm  # type: ignore[arg-type]
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)  # a guest to mount in
    return opened.task.id, handle, vm.id


def new_volume(deps: Deps, name: str = "work", size_gib: int = 4, caller: object = ALICE) -> str:
    return volumes.new(deps, caller, command(c.VolumeNewIn, name=name,  # type: ignore[arg-type]
                                             size_gib=size_gib)).volume.id


def attach(deps: Deps, handle: str, vm_id: str, volume_id: str, path: str = "/data",
            read_only: bool = False, caller: object = ALICE) -> c.VmOut:
    return volume_attach.attach(deps, caller, command(  # type: ignore[arg-type]
        c.VmAttachVolumeIn, handle=handle, vm_id=vm_id, volume_id=volume_id, path=path,
        read_only=read_only))


def far_vm_with_volume(deps: Deps) -> tuple[Deps, Files, str, str, str]:
    """A host `far` (fake:///far) added, and on it a VM holding a new volume at
    /work: (the deps with fake volume files and mounts, those files, the VM's
    handle, its id, the volume's id)."""
    files = Files()
    deps = replace(deps, volume_files=files, mounts=Mounts())
    hosts.add_host(deps, "far", "fake:///far", HostSize(64, 1_000_000))
    _, handle, vm_id = new_vm(deps)
    work = new_volume(deps)
    attach(deps, handle, vm_id, work, "/work")
    return deps, files, handle, vm_id, work
