"""Volumes on libvirt's test driver, wired by bootstrap as `rift serve` does (SPEC
§18): a fork of a VM holding a writable and a read-only volume runs beside its
source, which keeps both, one writer still; and a detach a crash cut is finished
by the sweep. The test driver runs no guest and plugs no disk: the rows, the
views and libvirt's domains are what is checked."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypervisor import write_test_host_xml
from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.services.background import sweeps
from rift.services.context import Deps
from rift.services.lifecycle import forks, tasks, vms, volume_attach, volumes
from tests.support.engine import ALICE

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("qemu-img", "mkfs.ext4")),
    reason="needs qemu-img and mkfs.ext4 (scripts/libvirt.sh installs them)")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Deps]:
    uri = write_test_host_xml(str(tmp_path / "node.xml"), 8, 8192)
    deps = build_deps(Settings(data_dir=tmp_path / "data", hypervisor_uri=uri,
                               database_url=f"sqlite:///{tmp_path / 'rift.db'}"))
    yield deps
    close_deps(deps)


def _attach(deps: Deps, handle: str, vm_id: str, volume_id: str, path: str,
            read_only: bool = False) -> None:
    volume_attach.attach(deps, ALICE, command(c.VmAttachVolumeIn, handle=handle, vm_id=vm_id,
                                              volume_id=volume_id, path=path,
                                              read_only=read_only))


def _holders(deps: Deps, volume_id: str) -> list[tuple[str, bool]]:
    got = volumes.get(deps, ALICE, command(c.VolumeIdIn, volume_id=volume_id)).volume
    return sorted((a.vm_id, a.read_only) for a in got.attached_to)


def test_a_fork_of_a_vm_with_a_writable_volume_runs_and_the_source_keeps_it(
        engine: Deps) -> None:
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=512)).vm
    written = volumes.new(engine, ALICE, command(c.VolumeNewIn, name="w", size_gib=1)).volume
    shared = volumes.new(engine, ALICE, command(c.VolumeNewIn, name="r", size_gib=1)).volume
    _attach(engine, handle, vm.id, written.id, "/work")
    _attach(engine, handle, vm.id, shared.id, "/data", read_only=True)
    made = forks.fork(engine, ALICE, command(c.VmForkIn, handle=handle, vm_id=vm.id,
                                             count=2)).vms
    assert [f.status for f in made] == ["running", "running"]
    assert all(f.volumes == [] for f in made)  # the test driver's fork holds no disk
    assert _holders(engine, written.id) == [(vm.id, False)]
    assert _holders(engine, shared.id) == [(vm.id, True)]
    source = vms.get(engine, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm
    assert source.status == "running" and len(source.volumes) == 2
    assert not sweeps.sweep(engine).reconciled.attachments_settled
    tasks.close(engine, ALICE, command(c.TaskCloseIn, handle=handle))
    assert _holders(engine, written.id) == [] and _holders(engine, shared.id) == []


def test_a_cut_detach_is_finished_by_the_sweep(engine: Deps) -> None:
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=512)).vm
    vol = volumes.new(engine, ALICE, command(c.VolumeNewIn, name="w", size_gib=1)).volume
    _attach(engine, handle, vm.id, vol.id, "/work")
    with engine.store.write() as tx:  # the detach's first step, then rift serve died
        att = tx.volumes.of_vms([vm.id])[vm.id][0]
        tx.volumes.save_attachment(att.detaching(), att)
    settled = sweeps.sweep(engine).reconciled.attachments_settled
    assert settled == [f"{vm.id}/{vol.id}"] and _holders(engine, vol.id) == []
    volumes.delete(engine, ALICE, command(c.VolumeIdIn, volume_id=vol.id))
    tasks.close(engine, ALICE, command(c.TaskCloseIn, handle=handle))
