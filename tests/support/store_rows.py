"""Rows for the store's tests (tests/integration/test_store_*.py): a task, a VM of it
and their insertion, at a fixed time T0, shaped as the engine writes them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from rift.domain.ids import new_task_id, new_vm_id
from rift.domain.model import Task, Vm
from rift.services.ports import Store

T0 = datetime(2026, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def a_task(owner: str = "ada", **changes: Any) -> Task:
    task = Task(
        id=new_task_id(), owner=owner, name="build the thing", status="open", lease_gen=0,
        secret_digest="a" * 64, holder="mcp:claude-code", held_since=T0,
        last_activity_at=T0, created_at=T0,
    )
    return dataclasses.replace(task, **changes)


def a_vm(task: Task, **changes: Any) -> Vm:
    vm = Vm(
        id=new_vm_id(), task_id=task.id, owner=task.owner, name="web", image="tiny",
        status="creating", host="local", vcpus=1, memory_mib=256, created_at=T0,
    )
    return dataclasses.replace(vm, **changes)


def insert(store: Store, *rows: Task | Vm) -> None:
    """Tasks and VMs, in one transaction, in the order given."""
    with store.write() as tx:
        for row in rows:
            if isinstance(row, Task):
                tx.tasks.add(row)
            else:
                tx.vms.add(row)
