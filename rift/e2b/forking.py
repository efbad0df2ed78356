"""A sandbox started from a snapshot (SPEC §12, §16): a task of its own and one VM
forked from the caller's snapshot (`rift_vm_fork` of another open task's snapshot
of the same user: the fork is handed over to its own task's key). What
`Sandbox.create(<snapshot id>)` and a fork (rift.e2b.snapshots) start. Blocking.
"""

from __future__ import annotations

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.snapshots import VmForkIn
from rift.contract.views import VmView
from rift.domain.errors import HypervisorFailed, InvalidArgument
from rift.services.context import Caller, Deps
from rift.services.lifecycle import forks, tasks

SNAPSHOT_PREFIX = "snap_"


def names_snapshot(template: str) -> bool:
    """Whether a template names a snapshot (`snap_…`), not an image."""
    return template.startswith(SNAPSHOT_PREFIX)


def start_fork(deps: Deps, caller: Caller, snapshot_id: str, task_name: str,
               egress: object = None) -> tuple[str, VmView]:
    """A task of its own (`task_name`) and one VM forked from the snapshot in it: (the
    task's handle, the VM). Its egress is its source's (the network is in the saved
    state): rules asked for are refused, not dropped."""
    if egress is not None:
        raise InvalidArgument("network", "a sandbox made from a snapshot keeps its source's "
                              "network rules; leave network and allow_internet_access out")
    opened = tasks.new(deps, caller, command(c.TaskNewIn, name=task_name))
    handle = opened.handle
    close = command(c.TaskCloseIn, handle=handle)
    try:
        vm = forks.fork(deps, caller, command(VmForkIn, handle=handle, snapshot_id=snapshot_id,
                                              name="sandbox")).vms[0]
    except BaseException:
        tasks.close(deps, caller, close)
        raise
    if vm.status != "running":
        tasks.close(deps, caller, close)
        raise HypervisorFailed(f"the fork did not start: {vm.error or vm.status}", vm.host)
    return handle, vm
