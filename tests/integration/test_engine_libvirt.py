"""The engine on SQLite and libvirt's test driver, wired by bootstrap as `rift serve` does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import libvirt
import pytest

from hypervisor import parse_rift_metadata, write_test_host_xml
from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.errors import RiftError
from rift.services.background import sweeps
from rift.services.context import Deps
from rift.services.lifecycle import leases, tasks, vms
from tests.support.databases import SQL_KINDS, empty_database_url
from tests.support.engine import ALICE, ALICE_2


@pytest.fixture
def host_uri(tmp_path: Path) -> str:
    return write_test_host_xml(str(tmp_path / "node.xml"), 8, 4096)


@pytest.fixture(params=SQL_KINDS)
def engine(request: pytest.FixtureRequest, data_dir: Path, host_uri: str,
           tmp_path: Path) -> Iterator[Deps]:
    """The engine on each SQL store: a SQLite file, and PostgreSQL when it runs."""
    url = empty_database_url(request.param, tmp_path)
    deps = build_deps(Settings(data_dir=data_dir, hypervisor_uri=host_uri, database_url=url))
    yield deps
    close_deps(deps)


def _domains(deps: Deps, uri: str) -> dict[str, tuple[str | None, str | None]]:
    return {d.name: (d.task_id, d.vm_id) for d in deps.hosts.hypervisor(uri).list_domains()}


def test_the_local_host_takes_its_size_from_libvirt(engine: Deps) -> None:
    with engine.store.read() as tx:
        local = tx.hosts.get("local")
    assert local is not None and (local.vcpus, local.memory_mib) == (8 * 4, 4096)  # overcommit 4


def test_a_vm_is_a_libvirt_domain_carrying_rift_metadata(engine: Deps, host_uri: str) -> None:
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    vm = vms.new(engine, ALICE, command(c.VmNewIn, handle=str(opened.handle), memory_mib=512)).vm
    assert vm.status == "running" and vm.ssh is None
    assert _domains(engine, host_uri) == {f"rift-{vm.id}": (opened.task.id, vm.id)}
    hv = engine.hosts.hypervisor(host_uri)
    conn = hv._connection()  # type: ignore[attr-defined]
    xml = conn.lookupByName(f"rift-{vm.id}").XMLDesc()
    assert parse_rift_metadata(xml) == (opened.task.id, vm.id)
    closed = tasks.close(engine, ALICE, command(c.TaskCloseIn, handle=str(opened.handle)))
    assert closed.destroyed == [vm.id]
    assert _domains(engine, host_uri) == {}
    with pytest.raises(libvirt.libvirtError):
        conn.lookupByName(f"rift-{vm.id}")


def test_a_vm_naming_no_image_is_debian_and_runs_at_once_showing_its_start(
        engine: Deps) -> None:
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    vm = vms.new(engine, ALICE, command(c.VmNewIn, handle=str(opened.handle), disk_gib=20)).vm
    assert (vm.status, vm.image, vm.memory_mib, vm.disk_gib, vm.ssh) == \
        ("running", "debian", 512, 20, None)
    assert vm.start is not None and vm.start.kind == "boot"
    assert 0 <= vm.start.ms < 30_000  # the test driver answers at once
    shown = vms.get(engine, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm
    assert (shown.start, shown.disk_gib) == (vm.start, 20)
    events = tasks.events(engine, ALICE, command(c.TaskEventsIn, task_id=opened.task.id)).events
    running = next(e for e in events if e.type == "vm_running")
    assert running.details["start_kind"] == "boot"


def test_rift_default_image_names_the_image_of_a_vm_that_names_none(
        data_dir: Path, host_uri: str) -> None:
    for image, answer in (("tiny", "tiny"), ("windows", "image_not_found")):
        deps = build_deps(Settings(data_dir=data_dir, hypervisor_uri=host_uri,
                                   default_image=image))
        try:
            opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
            try:
                got = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm.image
            except RiftError as exc:
                got = exc.code
            assert got == answer
        finally:
            close_deps(deps)


def test_the_test_hosts_memory_is_accounted_by_placement(engine: Deps) -> None:
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    for _ in range(4):
        vms.new(engine, ALICE, command(c.VmNewIn, handle=str(opened.handle), memory_mib=1024))
    with pytest.raises(RiftError) as info:
        vms.new(engine, ALICE, command(c.VmNewIn, handle=str(opened.handle), memory_mib=64))
    assert info.value.code == "no_capacity"


def test_an_idle_task_is_closed_by_the_sweep_and_its_domains_destroyed(
        data_dir: Path, host_uri: str) -> None:
    settings = Settings(data_dir=data_dir, hypervisor_uri=host_uri, task_idle_s=1,
                        activity_step_s=1)
    deps = build_deps(settings)
    try:
        opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
        vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle)))
        with deps.store.write() as tx:  # make it quiet without sleeping
            task = tx.tasks.get(opened.task.id)
            assert task is not None
            earlier = replace(task, lease_gen=task.lease_gen + 1,
                              last_activity_at=task.last_activity_at.replace(year=2020))
            assert tx.tasks.save(earlier, expected_gen=task.lease_gen)
        report = sweeps.sweep(deps)
        assert report.closed == [opened.task.id] and len(report.destroyed) == 1
        assert _domains(deps, host_uri) == {}
    finally:
        close_deps(deps)


def test_twenty_threads_attaching_one_released_task_give_exactly_one_winner(
        engine: Deps) -> None:
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    task_id = opened.task.id
    handle = str(opened.handle)
    for round_ in range(50):
        leases.release(engine, ALICE, command(c.TaskReleaseIn, handle=handle))
        barrier = threading.Barrier(20)
        won: list[str] = []
        refusals: list[str] = []
        lock = threading.Lock()

        def attach(barrier: threading.Barrier = barrier, lock: threading.Lock = lock,
                   won: list[str] = won, refusals: list[str] = refusals) -> None:
            barrier.wait(timeout=30)
            try:
                got = leases.attach(engine, ALICE_2, command(c.TaskAttachIn, task_id=task_id))
                with lock:
                    won.append(str(got.handle))
            except RiftError as exc:
                with lock:
                    refusals.append(exc.code)

        threads = [threading.Thread(target=attach) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(won) == 1, f"round {round_}: {len(won)} winners"
        assert refusals == ["task_held"] * 19, f"round {round_}: {refusals}"
        handle = won[0]
    types: list[str] = []
    after = 0
    while True:
        page = tasks.events(engine, ALICE, command(c.TaskEventsIn, task_id=task_id, after_id=after,
                   limit=100))
        types += [e.type for e in page.events]
        after = page.next_after
        if not page.has_more:
            break
    assert types.count("attached") == 50 and types.count("released") == 50


def test_serve_destroys_a_domain_made_behind_its_back_before_taking_calls(
        data_dir: Path, host_uri: str) -> None:
    """A crash left a domain with Rift metadata and no row: the app's start removes it."""
    import asyncio

    from hypervisor import DomainSpec
    from rift.app import create_app

    deps = build_deps(Settings(data_dir=data_dir, hypervisor_uri=host_uri))
    try:
        hv = deps.hosts.hypervisor(host_uri)
        hv.create(DomainSpec(name="rift-vm_leakedaa", task_id="task_aaaaaaaa",
                             vm_id="vm_leakedaa", vcpus=1, memory_mib=64, image="tiny",
                             install=deps.install_id))
        hv.create(DomainSpec(name="rift-vm_otherrrr", task_id="task_aaaaaaaa",
                             vm_id="vm_otherrrr", vcpus=1, memory_mib=64, image="tiny",
                             install="rift_another_control_plane"))
        assert "rift-vm_leakedaa" in _domains(deps, host_uri)
        app = create_app(Settings(data_dir=data_dir, hypervisor_uri=host_uri), deps)

        async def start_and_stop() -> None:
            async with app.router.lifespan_context(app):
                left = _domains(deps, host_uri)
                assert "rift-vm_leakedaa" not in left
                assert "rift-vm_otherrrr" in left  # another installation's: not ours to touch

        asyncio.run(start_and_stop())
    finally:
        close_deps(deps)


def test_placement_spreads_vms_over_test_driver_hosts_of_different_sizes(
        engine: Deps, tmp_path: Path) -> None:
    """Each host is its own libvirt test-driver node of a chosen size."""
    from rift.services.operator import hosts

    small = write_test_host_xml(str(tmp_path / "small.xml"), 2, 1024)
    large = write_test_host_xml(str(tmp_path / "large.xml"), 4, 6144)
    hosts.add_host(engine, "small", small, hosts.HostSize(vcpus=2, memory_mib=1024))
    hosts.add_host(engine, "large", large, hosts.HostSize(vcpus=4, memory_mib=6144))
    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    placed = [vms.new(engine, ALICE, command(c.VmNewIn, handle=handle,
                  memory_mib=1024)).vm.host for _ in range(6)]
    # Free memory before each pick (large, local, small): 6144/4096/1024 → large;
    # 5120/4096 → large; 4096/4096 tie → large (by name); 3072/4096 → local;
    # 3072/3072 tie → large; 2048/3072 → local. small never has the most.
    assert placed == ["large", "large", "large", "local", "large", "local"]
    on_large = {d.name for d in engine.hosts.hypervisor(large).list_domains()}
    assert len(on_large) == placed.count("large")
    hosts.drain_host(engine, "large")
    after_drain = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=512)).vm.host
    assert after_drain != "large"
    with pytest.raises(RiftError) as info:
        vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=4096))
    assert info.value.code == "no_capacity"
    assert info.value.details["largest_free"]["memory_mib"] < 4096
    listed = {h["name"]: h for h in hosts.list_hosts(engine)}
    assert listed["large"]["state"] == "drained"
    assert listed["large"]["used_memory_mib"] == 1024 * placed.count("large")


def test_a_paused_vm_is_a_managed_save_on_the_test_driver_and_resumes_at_once(
        engine: Deps, host_uri: str) -> None:
    from rift.services.background import reconcile
    from rift.services.lifecycle import pauses

    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=3000)).vm
    assert pauses.pause(engine, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm.id)).vm.status == "paused"
    conn = engine.hosts.hypervisor(host_uri)._connection()  # type: ignore[attr-defined]
    dom = conn.lookupByName(f"rift-{vm.id}")
    assert not dom.isActive() and dom.hasManagedSaveImage(0)
    # Its memory is free for another VM meanwhile, and reconciliation leaves it be.
    other = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle,
                memory_mib=3000)).vm  # no room for both
    assert other.status == "running"
    assert not reconcile.reconcile(engine)
    with pytest.raises(RiftError) as full:
        pauses.resume(engine, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm.id))
    assert full.value.code == "no_capacity"
    vms.destroy(engine, ALICE, command(c.VmDestroyIn, vm_id=other.id, handle=handle))
    assert pauses.resume(engine, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=vm.id)).vm.status == "running"
    assert dom.isActive() and not dom.hasManagedSaveImage(0)
    pauses.pause(engine, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm.id))
    closed = tasks.close(engine, ALICE, command(c.TaskCloseIn, handle=handle))
    assert vm.id in closed.destroyed and _domains(engine, host_uri) == {}


def test_a_snapshot_is_a_saved_file_on_the_test_driver_and_forks_answer_at_once(
        engine: Deps, host_uri: str, data_dir: Path) -> None:
    from rift.services.lifecycle import forks, snapshots

    opened = tasks.new(engine, ALICE, command(c.TaskNewIn))
    handle = str(opened.handle)
    vm = vms.new(engine, ALICE, command(c.VmNewIn, handle=handle, memory_mib=512)).vm
    snap = snapshots.make(engine, ALICE, command(c.VmSnapshotIn, handle=handle, vm_id=vm.id,
               name="base")).snapshot
    state = data_dir / "snapshots" / snap.id / "state"
    assert state.is_file() and snap.bytes > 0
    assert vms.get(engine, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.status == "running"
    forks = forks.fork(engine, ALICE, command(c.VmForkIn, handle=handle, snapshot_id=snap.id,
                count=2)).vms
    assert [f.status for f in forks] == ["running", "running"]
    assert set(_domains(engine, host_uri)) == {f"rift-{v.id}" for v in (vm, *forks)}
    closed = tasks.close(engine, ALICE, command(c.TaskCloseIn, handle=handle))
    assert len(closed.destroyed) == 3 and closed.task.snapshots == []
    assert _domains(engine, host_uri) == {} and not state.parent.exists()
