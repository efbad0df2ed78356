"""Sleep and wake (SPEC §17) across replicas, on SQLite and PostgreSQL: two engines
on one database (each its own store, as two `rift serve` are) racing to put a VM
to sleep and to wake it make one `vm_slept` and one `vm_woke` between them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from rift.catalog import StaticImages
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.domain.leases import LeaseRules
from rift.services.context import Deps, Limits
from rift.services.lifecycle import execs, sleeps, tasks, vms
from rift.services.operator.hosts import ensure_local_host
from rift.services.ports import Store
from rift.store.sql import SqlStore
from tests.support.engine import ALICE, FakePool, event_types
from tests.support.fake_guest import FakeExecs, fake_guests
from tests.support.vm_rows import give_ssh_address


def _replicas(store: Store) -> list[Deps]:
    clock, pool, guests = FakeClock(), FakePool(), fake_guests(execs=FakeExecs())
    first = Deps(store=store, clock=clock, hosts=pool, images=StaticImages(["debian"]),
                 lease_rules=LeaseRules(), limits=Limits(), guests=guests)
    ensure_local_host(first, "fake:///local")
    assert isinstance(store, SqlStore)
    return [first, replace(first, store=SqlStore(store.url))]


def test_replicas_racing_put_a_vm_to_sleep_once_and_wake_it_once(store: Store) -> None:
    one, two = _replicas(store)
    try:
        opened = tasks.new(one, ALICE, command(c.TaskNewIn, sleep_after_s=60))
        handle = str(opened.handle)
        vm = vms.new(one, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
        with one.store.write() as tx:
            give_ssh_address(tx, vm.id)
        one.clock.advance(60 + 60 + 1)  # type: ignore[attr-defined]
        slept: list[list[str]] = []
        go = threading.Barrier(4)

        def sweep(deps: Deps) -> None:
            go.wait()
            slept.append(sleeps.sleep_quiet(deps))

        _run([partial(sweep, d) for d in (one, two, one, two)])
        assert [vm_id for each in slept for vm_id in each] == [vm.id]
        answers: list[str] = []
        go = threading.Barrier(8)

        def call(deps: Deps) -> None:
            go.wait()
            answers.append(execs.start(deps, ALICE, command(
                c.VmExecIn, handle=handle, vm_id=vm.id, command="echo hi")).status)

        _run([partial(call, d) for d in (one, two) * 4])
        assert answers == ["exited"] * 8
        types = event_types(one, opened.task.id)
        assert (types.count("vm_slept"), types.count("vm_woke")) == (1, 1)
    finally:
        two.store.close()


def _run(calls: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_a_sweep_racing_calls_either_leaves_the_vm_awake_or_it_is_woken(
        store: Store) -> None:
    one, two = _replicas(store)
    try:
        opened = tasks.new(one, ALICE, command(c.TaskNewIn, sleep_after_s=60))
        handle = str(opened.handle)
        vm = vms.new(one, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
        with one.store.write() as tx:
            give_ssh_address(tx, vm.id)
        def sweep(go: threading.Barrier) -> None:
            go.wait()
            sleeps.sleep_quiet(one)

        def call(go: threading.Barrier, answers: list[str], deps: Deps) -> None:
            go.wait()
            answers.append(execs.start(deps, ALICE, command(
                c.VmExecIn, handle=handle, vm_id=vm.id, command="echo hi")).status)

        for _ in range(5):
            one.clock.advance(60 + 60 + 1)  # type: ignore[attr-defined]
            answers: list[str] = []
            go = threading.Barrier(3)
            _run([partial(sweep, go), partial(call, go, answers, two),
                  partial(call, go, answers, one)])
            assert answers == ["exited", "exited"]
            with one.store.read() as tx:
                now = tx.vms.get(vm.id)
            assert now is not None and (now.status, now.change) == ("running", None)
        types = event_types(one, opened.task.id)
        assert types.count("vm_slept") == types.count("vm_woke")
    finally:
        two.store.close()
