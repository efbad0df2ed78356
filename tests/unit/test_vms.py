"""VMs: placement, quotas, keys, failures and destroy, against fakes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.operator import TaskIdIn
from rift.domain.clock import FakeClock
from rift.services.context import Deps
from rift.services.lifecycle import leases, tasks, vms
from rift.services.operator import hosts
from rift.services.operator.hosts import HostSize
from tests.support.engine import ALICE, ALICE_2, BOB, FakePool, event_types, refused, snapshot


def _task(deps: Deps) -> tuple[str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    return opened.task.id, str(opened.handle)


def test_a_new_vm_runs_on_the_host_with_its_metadata(deps: Deps,
                                                     local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, name="builder", image="tiny",
             vcpus=2, memory_mib=512)).vm
    assert vm.status == "running" and vm.task_id == task_id and vm.name == "builder"
    assert (vm.image, vm.vcpus, vm.memory_mib, vm.disk_gib, vm.host) == \
        ("tiny", 2, 512, 10, "local")
    assert vm.ready_at is not None and vm.error is None and vm.ssh is None
    domain = local_hv.domains[f"rift-{vm.id}"]
    assert (domain.task_id, domain.vm_id) == (task_id, vm.id)
    assert event_types(deps, task_id) == ["opened", "vm_creating", "vm_running"]
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm == vm


def test_a_vm_that_names_no_image_gets_the_default_image_with_its_sizes(
        deps: Deps) -> None:
    _, handle = _task(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    assert (vm.image, vm.memory_mib, vm.disk_gib) == ("debian", 512, 10)  # RIFT_DEFAULT_IMAGE
    tiny = vms.new(replace(deps, default_image="tiny"), ALICE, command(c.VmNewIn, handle=handle)).vm
    assert (tiny.image, tiny.memory_mib) == ("tiny", 256)


def test_a_default_image_that_is_not_known_is_refused_like_naming_it(deps: Deps) -> None:
    _, handle = _task(deps)
    named = refused("image_not_found", lambda: vms.new(deps, ALICE, command(c.VmNewIn,
                                           handle=handle, image="windows")))
    before = snapshot(deps)
    default = refused("image_not_found", lambda: vms.new(
        replace(deps, default_image="windows"), ALICE, command(c.VmNewIn, handle=handle)))
    assert (default.message, default.hint, default.details) == \
        (named.message, named.hint, named.details)
    assert snapshot(deps) == before


def test_the_disk_size_is_kept_on_the_vm_and_shown(deps: Deps) -> None:
    _, handle = _task(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, disk_gib=40)).vm
    assert vm.disk_gib == 40
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.disk_gib == 40
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny",
               disk_gib=1024)).vm.disk_gib == 1024


def test_a_started_vm_shows_how_it_started_and_how_long_it_took(
        deps: Deps, clock: FakeClock, local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(deps)
    real_create = local_hv.create
    seen: list[object] = []

    def slow_create(spec):  # type: ignore[no-untyped-def]
        seen.append(vms.get(deps, ALICE, command(c.VmGetIn,
                        vm_id=spec.vm_id)).vm.start)  # still creating
        clock.advance(1.25)
        real_create(spec)

    local_hv.create = slow_create  # type: ignore[method-assign]
    started: list[tuple[str, float]] = []
    deps.observers.vm_start_seconds.append(lambda kind, s: started.append((kind, s)))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    assert seen == [None]
    assert vm.start is not None and (vm.start.kind, vm.start.ms) == ("boot", 1250)
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.start == vm.start
    assert started == [("boot", 1.25)]
    with deps.store.read() as tx:
        running = [e for e in tx.events.page(task_id, 0, 100) if e.type == "vm_running"]
    assert running[0].details["start_kind"] == "boot"
    assert running[0].details["start_ms"] == 1250


def test_a_vm_that_never_ran_has_no_start(deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle = _task(deps)
    local_hv.fail_next_create("internal error: no more room in the test driver")
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    assert vm.status == "failed" and vm.start is None
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.start is None


def test_bad_sizes_and_unknown_images_are_refused_and_change_nothing(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle = _task(deps)
    before = snapshot(deps)
    for field, value in (("vcpus", 0), ("vcpus", 65), ("memory_mib", 63),
                         ("memory_mib", 65537), ("vcpus", -1), ("memory_mib", 10**12),
                         ("disk_gib", 0), ("disk_gib", 1025), ("disk_gib", -1)):
        err = refused("invalid_argument", lambda field=field, value=value: vms.new(
            deps, ALICE, command(c.VmNewIn, handle=handle, **{field: value})))
        assert err.details["field"] == field
    err = refused("image_not_found", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
                                         image="windows")))
    assert "tiny" in err.details["images"]
    assert snapshot(deps) == before and local_hv.domains == {}


def test_every_image_the_store_knows_is_accepted(deps: Deps) -> None:
    _, handle = _task(deps)
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
               image="debian")).vm.image == "debian"


def test_vms_per_task_are_capped(make_deps: Callable[..., Deps]) -> None:
    deps = make_deps(max_vms_per_task=2)
    _, handle = _task(deps)
    first = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    vms.new(deps, ALICE, command(c.VmNewIn, handle=handle))
    err = refused("quota_exceeded", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)))
    assert "rift_vm_destroy" in err.hint
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=first.id, handle=handle))
    vms.new(deps, ALICE, command(c.VmNewIn, handle=handle))


def test_vm_creation_is_rate_limited(make_deps: Callable[..., Deps]) -> None:
    deps = make_deps(rate_vm_new_per_h=1)
    _, handle = _task(deps)
    vms.new(deps, ALICE, command(c.VmNewIn, handle=handle))
    refused("rate_limited", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)))


def test_placement_takes_the_host_with_most_free_memory_and_skips_drained(
        deps: Deps, pool: FakePool) -> None:
    hosts.add_host(deps, "small", "fake:///small", HostSize(4, 1024))
    hosts.add_host(deps, "big", "fake:///big", HostSize(4, 100_000))
    _, handle = _task(deps)
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm.host == "big"
    hosts.drain_host(deps, "big")
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm.host == "local"
    assert "rift-" in next(iter(pool.hypervisor("fake:///big").domains))


def test_a_host_that_does_not_let_rift_in_or_runs_an_old_libvirt_is_not_added(
        deps: Deps, pool: FakePool) -> None:
    from hypervisor.base import HypervisorError

    before = snapshot(deps)
    old = pool.hypervisor("fake:///old")
    old.version = "libvirt 8.0.0 qemu 6.2.0"
    err = refused("invalid_argument", hosts.add_host, deps, "old", "fake:///old")
    assert "libvirt 9.0.0 or newer" in err.message and "8.0.0" in err.message
    for name, words, said in (
            ("far", "Cannot recv data: ssh: connect to host 10.0.0.9 port 22: No route to "
                    "host", "does not answer"),
            ("locked", "Cannot recv data: root@10.0.0.9: Permission denied (publickey).",
             "refused the SSH key")):
        hv = pool.hypervisor(f"fake:///{name}")

        def fail(words: str = words) -> object:
            raise HypervisorError("open", words)

        hv.info = fail  # type: ignore[assignment,method-assign]
        err = refused("hypervisor_error", hosts.add_host, deps, name, f"fake:///{name}")
        assert said in err.message and words in err.message, err.message
    assert snapshot(deps) == before  # nothing added
    assert sorted(h["name"] for h in hosts.list_hosts(deps)) == ["local"]


def test_no_host_fitting_answers_no_capacity_with_the_largest_free_slot(deps: Deps) -> None:
    _, handle = _task(deps)
    err = refused("no_capacity", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
                                     memory_mib=65536)))
    # the fake host's 16 CPUs offered 4 times over (RIFT_CPU_OVERCOMMIT's default)
    assert err.details["largest_free"] == {"vcpus": 64, "memory_mib": 32768}
    vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, vcpus=60))
    refused("no_capacity", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, vcpus=5)))


def test_capacity_counts_live_vms_only(deps: Deps) -> None:
    _, handle = _task(deps)
    big = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, memory_mib=30000)).vm
    refused("no_capacity", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
                               memory_mib=4096)))
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=big.id, handle=handle))
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
               memory_mib=4096)).vm.status == "running"


def test_a_hypervisor_failure_leaves_a_failed_row_with_libvirts_words_and_no_domain(
        deps: Deps, local_hv: FakeHypervisor, caplog: pytest.LogCaptureFixture) -> None:
    task_id, handle = _task(deps)
    local_hv.fail_next_create("internal error: no more room in the test driver")
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    assert vm.status == "failed" and "no more room" in vm.error
    told = [r for r in caplog.records if r.getMessage() == "vm start failed"]
    assert [(r.levelname, getattr(r, "vm_id", None), getattr(r, "error", None))
            for r in told] == [("WARNING", vm.id, vm.error)]  # the operator's log says why
    assert local_hv.domains == {}
    assert event_types(deps, task_id)[-2:] == ["vm_creating", "vm_failed"]
    assert vms.new(deps, ALICE, command(c.VmNewIn,
               handle=handle)).vm.status == "running"  # failed VMs use no room


def test_a_keyed_vm_create_replays_without_a_second_domain(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle = _task(deps)
    first = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, idempotency_key="vm-1")).vm
    again = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, idempotency_key="vm-1")).vm
    assert again.id == first.id and len(local_hv.domains) == 1
    for other in ({"memory_mib": 1024}, {"disk_gib": 20}, {"image": "tiny"}):
        refused("idempotency_conflict", lambda other=other: vms.new(
            deps, ALICE, command(c.VmNewIn, handle=handle, idempotency_key="vm-1", **other)))
    assert len(local_hv.domains) == 1


def test_destroy_by_handle_removes_the_domain_and_repeats_quietly(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    gone = vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm.id, handle=handle)).vm
    assert gone.status == "destroyed" and gone.destroyed_at is not None
    assert local_hv.domains == {}
    assert vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm.id,
               handle=handle)).vm.status == "destroyed"
    assert event_types(deps, task_id).count("vm_destroyed") == 1


def test_destroy_by_id_follows_attachs_rules(deps: Deps, clock: FakeClock,
                                             local_hv: FakeHypervisor) -> None:
    _, handle = _task(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    refused("task_held", lambda: vms.destroy(deps, ALICE_2, command(c.VmDestroyIn, vm_id=vm.id)))
    assert len(local_hv.domains) == 1
    clock.advance(1800)
    assert vms.destroy(deps, ALICE_2, command(c.VmDestroyIn, vm_id=vm.id)).vm.status == "destroyed"


def test_a_vm_is_found_only_in_the_callers_tasks(deps: Deps) -> None:
    _, handle = _task(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    refused("vm_not_found", lambda: vms.get(deps, BOB, command(c.VmGetIn, vm_id=vm.id)))
    refused("vm_not_found", lambda: vms.destroy(deps, BOB, command(c.VmDestroyIn, vm_id=vm.id,
                                takeover=True)))
    other = tasks.new(deps, ALICE, command(c.TaskNewIn))
    err = refused("vm_not_found", lambda: vms.destroy(deps, ALICE, command(c.VmDestroyIn,
                                      vm_id=vm.id, handle=str(other.handle))))
    assert "rift_task_get" in err.hint
    refused("invalid_argument", lambda: vms.get(deps, ALICE, command(c.VmGetIn, vm_id="vm_nope")))


def test_new_vm_under_a_stale_or_released_handle_makes_nothing(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(deps)
    won = leases.attach(deps, ALICE_2, command(c.TaskAttachIn, task_id=task_id, takeover=True))
    refused("lease_stale", lambda: vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)))
    leases.release(deps, ALICE_2, command(c.TaskReleaseIn, handle=str(won.handle)))
    refused("task_released", lambda: vms.new(deps, ALICE, command(c.VmNewIn,
                                 handle=str(won.handle))))
    assert local_hv.domains == {}
    assert "vm_creating" not in event_types(deps, task_id)


def test_a_vm_started_while_its_task_closed_is_taken_down(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(deps)
    real_create = local_hv.create

    def create_then_close(spec):  # type: ignore[no-untyped-def]
        real_create(spec)
        tasks.close_as_operator(deps, command(TaskIdIn,
            task_id=task_id))  # the close lands while libvirt starts it

    local_hv.create = create_then_close  # type: ignore[method-assign]
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    assert vm.status == "destroyed"
    assert local_hv.domains == {}


def test_a_destroy_libvirt_refuses_answers_hypervisor_error_and_keeps_the_row_live(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    _, handle = _task(deps)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm
    local_hv.fail_destroy("cannot acquire state change lock")
    err = refused("hypervisor_error", lambda: vms.destroy(deps, ALICE, command(c.VmDestroyIn,
                                          vm_id=vm.id, handle=handle)))
    assert "state change lock" in err.message
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.status == "running"
    local_hv.fail_destroy(None)
    assert vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=vm.id,
               handle=handle)).vm.status == "destroyed"


def test_egress_is_the_default_or_asked_for_and_a_none_vms_network_is_restricted(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(deps)
    opened = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    closed = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", egress="none")).vm
    by_default = vms.new(replace(deps, default_egress="none"), ALICE, command(c.VmNewIn,
                     handle=handle, image="tiny")).vm
    assert (opened.egress, closed.egress, by_default.egress) == ("open", "none", "none")
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=closed.id)).vm.egress == "none"
    specs = {vm.id: local_hv.domains[f"rift-{vm.id}"].spec for vm in (opened, closed)}
    assert [(s.restrict if s else None) for s in specs.values()] == [False, True]
    with deps.store.read() as tx:
        creating = [e.details for e in tx.events.page(task_id, 0, 100) if e.type == "vm_creating"]
    assert [d["egress"] for d in creating] == ["open", "none", "none"]


def test_an_egress_allowlist_is_kept_canonical_and_its_vm_runs_proxied(
        deps: Deps, local_hv: FakeHypervisor) -> None:
    task_id, handle = _task(deps)
    asked = {"allow": ["PyPI.org.", "*.github.com", "10.1.2.3", "10.0.0.0/8", "pypi.org"]}
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", egress=asked)).vm
    kept = {"allow": ["*.github.com", "10.0.0.0/8", "10.1.2.3/32", "pypi.org"]}
    assert vm.model_dump()["egress"] == kept
    assert vms.get(deps, ALICE, command(c.VmGetIn, vm_id=vm.id)).vm.model_dump()["egress"] == kept
    spec = local_hv.domains[f"rift-{vm.id}"].spec
    assert spec is not None and (spec.proxied, spec.restrict) == (True, False)
    with deps.store.read() as tx:
        creating = [e.details for e in tx.events.page(task_id, 0, 100) if e.type == "vm_creating"]
    assert creating[-1]["egress"] == kept


def test_a_bad_egress_is_refused_and_changes_nothing(deps: Deps) -> None:
    _, handle = _task(deps)
    before = snapshot(deps)
    for bad in ("sometimes", "", "OPEN", 3, {"allow": []}, {"allow": ["a b"]},
                {"allow": ["10.0.0.0/33"]}, {"allow": ["*.com"]}, {"allow": ["x" * 254]},
                {"allow": [f"h{i}.example" for i in range(65)]}, {"allow": ["ok.org"], "x": 1},
                {"allow": "pypi.org"}, {"allow": [3]}):
        err = refused("invalid_argument", lambda bad=bad: vms.new(
            deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", egress=bad)))
        assert err.details["field"] == "egress"
    assert snapshot(deps) == before


def test_a_vm_with_an_egress_allowlist_is_placed_on_this_machine_only(
        deps: Deps, pool: FakePool) -> None:
    # Its egress proxy is the `rift serve` beside it: on a host elsewhere it would
    # reach nothing.
    hosts.add_host(deps, "far", "fake+ssh://rift@far/system", HostSize(16, 1_000_000))
    _, handle = _task(deps)
    listed = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle,
                                          egress={"allow": ["pypi.org"]})).vm
    assert listed.host == "local"
    assert vms.new(deps, ALICE, command(c.VmNewIn, handle=handle)).vm.host == "far"
    hosts.drain_host(deps, "local")
    refused("no_capacity", lambda: vms.new(deps, ALICE, command(
        c.VmNewIn, handle=handle, egress={"allow": ["pypi.org"]})))
