"""The operator's commands (the `rift` CLI on the control plane's machine): what
`rift task show|close` and `rift pool set` take, with the same ranges as the
tools' inputs (rift/contract/base.py), checked when the CLI builds them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rift.contract.base import Input as Command
from rift.contract.base import MemoryMib, NoNul, SnapshotId, TaskId, Vcpus, Whole

MAX_POOL = 64  # VMs of one kind a pool may keep

PoolCount = Annotated[int, Field(ge=0, le=MAX_POOL), Whole]


class TaskIdIn(Command):
    """One task of any user, named by its id (and who asks, for its events)."""

    task_id: TaskId
    by: str | None = None


class PoolSetIn(Command):
    """Create or resize the pool of an image and size (on one host, or any)."""

    image: Annotated[str, Field(min_length=1, max_length=200), NoNul]
    running: PoolCount | None = None
    saved: PoolCount | None = None
    vcpus: Vcpus | None = None
    memory_mib: MemoryMib | None = None
    host: Annotated[str, Field(min_length=1, max_length=200), NoNul] | None = None


class ImageFromSnapshotIn(Command):
    """`rift image add NAME --snapshot SNAP_ID` (the name's own rules are the
    catalog's, rift/catalog.py)."""

    name: str
    snapshot_id: SnapshotId
