"""A `rift host drain --move` killed mid-copy (rift.services.operator.move_copies):
what it put on the destination goes with a later reconciliation once nothing
references it, and a copy a row references, or a running drain's, stays. Fake
hypervisors and volume files, a real SQLite store; the kill is an exception no
handler of the drain catches, from a process the journal names as gone."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field, replace

import pytest

from hypervisor.base import DomainSpec
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background import reconcile
from rift.services.context import Deps
from rift.services.lifecycle import volumes
from rift.services.operator import hosts, move_copies
from rift.services.operator.hosts import HostSize
from rift.services.operator.move_copies import Copy, record
from rift.services.operator.moves import drain_and_move
from rift.services.ports.hosts import Overlay
from tests.support.engine import ALICE, FakePool
from tests.support.volumes import Files, Mounts, attach, new_vm, new_volume

FAR = "qemu+ssh://root@far.example/system"
FAR2 = "qemu+ssh://root@far2.example/system"
DEAD = f"{socket.gethostname()}/999999999/0"  # no such process on this machine


class Killed(BaseException):
    """SIGKILL, as far as the drain's handlers go: none of them runs."""


@dataclass
class HostFiles:
    """The hosts' files over their SSH: what was put on each and what went."""

    forgot: list[tuple[str, str]] = field(default_factory=list)

    def prepare(self, uri: str, spec: DomainSpec) -> None:
        return None

    def receive(self, uri: str, spec: DomainSpec, overlay: Overlay | None) -> None:
        return None

    def forget(self, uri: str, vm_id: str) -> None:
        self.forgot.append((uri, vm_id))


def _elsewhere(deps: Deps, pool: FakePool, name: str, uri: str) -> None:
    """Host `name` (a fake, where its VMs started) is a host elsewhere from now on."""
    pool.by_uri[uri] = pool.hypervisor(f"fake:///{name}")
    with deps.store.write() as tx:
        was = tx.hosts.get(name, lock=True)
        assert was is not None
        assert tx.hosts.save(was.resized(uri, was.vcpus, was.memory_mib), was)


def _far_vm_with_a_volume(deps: Deps, pool: FakePool) -> tuple[str, str]:
    hosts.add_host(deps, "far", "fake:///far", HostSize(64, 1_000_000))
    _, handle, vm_id = new_vm(deps)
    work = new_volume(deps)
    attach(deps, handle, vm_id, work, "/work")
    _elsewhere(deps, pool, "far", FAR)
    return vm_id, work


def test_a_drain_killed_mid_copy_leaves_nothing_on_the_destination_once_reconciled(
        deps: Deps, pool: FakePool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a host elsewhere to this machine: killed while the volume's file goes.
    The VM's own files here are its row's while it lives (a VM elsewhere has its
    files made here first): its entry waits while the VM is marked moving, then goes."""
    files = Files()
    deps = replace(deps, volume_files=files, mounts=Mounts())
    vm_id, work = _far_vm_with_a_volume(deps, pool)
    local_uri = next(h["uri"] for h in hosts.list_hosts(deps) if h["name"] == "local")

    def send(uri: str, dest_uri: str, volume_id: str, whole: bool) -> None:
        files.calls.append(("send", volume_id, dest_uri))
        raise Killed  # mid-copy: the file is partly there

    monkeypatch.setattr(files, "send", send)
    monkeypatch.setattr(move_copies, "writer", lambda: DEAD)  # the drain's process
    with pytest.raises(Killed):
        drain_and_move(deps, "far")
    monkeypatch.undo()
    files.calls.clear()

    first = reconcile.reconcile(deps)  # the VM is still marked moving: its entry waits
    assert first.copies_removed == [f"volume:{work}@{local_uri}"]
    assert files.calls == [("remove", work)] and not first.vanished
    assert [e[:3] for e in _journal(deps)] == [["vm", vm_id, local_uri]]
    clock.advance(deps.limits.creating_grace_s + 1)
    later = reconcile.reconcile(deps)  # the mark rolled back: the VM runs on far
    assert later.changes_settled == [vm_id] and later.copies_removed == []
    assert _journal(deps) == []
    assert volumes.get(deps, ALICE, command(c.VolumeIdIn, volume_id=work)).volume.host == "far"
    assert files.calls == [("remove", work)]


def test_a_vms_copy_on_a_host_elsewhere_its_row_does_not_name_goes(
        deps: Deps, pool: FakePool, monkeypatch: pytest.MonkeyPatch) -> None:
    far_files = HostFiles()
    deps = replace(deps, volume_files=Files(), mounts=Mounts(), host_files=far_files)
    vm_id, _ = _far_vm_with_a_volume(deps, pool)
    monkeypatch.setattr(move_copies, "writer", lambda: DEAD)
    record(deps, [Copy("vm", vm_id, FAR2), Copy("vm", vm_id, FAR)])
    monkeypatch.undo()
    assert reconcile.reconcile(deps).copies_removed == [f"vm:{vm_id}@{FAR2}"]
    assert far_files.forgot == [(FAR2, vm_id)] and _journal(deps) == []


def _journal(deps: Deps) -> list[list[str]]:
    with deps.store.read() as tx:
        raw = tx.meta.get(move_copies.KEY)
    return json.loads(raw) if raw else []


def test_a_copy_a_row_references_or_a_running_drain_makes_stays(
        deps: Deps, pool: FakePool, monkeypatch: pytest.MonkeyPatch) -> None:
    files, far_files = Files(), HostFiles()
    deps = replace(deps, volume_files=files, mounts=Mounts(), host_files=far_files)
    vm_id, work = _far_vm_with_a_volume(deps, pool)
    local_uri = next(h["uri"] for h in hosts.list_hosts(deps) if h["name"] == "local")
    # a drain killed after the rows named the copies: they are the VM's and the volume's;
    # and this machine's files of a VM live elsewhere (made here first, they go with it)
    monkeypatch.setattr(move_copies, "writer", lambda: DEAD)
    record(deps, [Copy("vm", vm_id, FAR), Copy("volume", work, FAR), Copy("vm", vm_id, local_uri)])
    monkeypatch.undo()
    record(deps, [Copy("volume", work, local_uri)])  # a drain of this process, running
    files.calls.clear()
    assert reconcile.reconcile(deps).copies_removed == []
    assert files.calls == [] and far_files.forgot == []
    assert [e[:3] for e in _journal(deps)] == [["volume", work, local_uri]]
