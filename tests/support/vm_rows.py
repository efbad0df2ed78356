"""VM rows as tests set them up: what a real start or a crash leaves, written
straight to the store (the fake hosts have no guest to answer over SSH)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from rift.domain.model import VmChange, VmStatus
from rift.services.ports import Tx


def give_ssh_address(tx: Tx, vm_id: str, port: int = 2222) -> None:
    """The running VM is reached over SSH at 127.0.0.1:`port`, as a guest would be."""
    vm = tx.vms.get(vm_id)
    assert vm is not None and vm.status == "running", vm
    assert tx.vms.save(replace(vm, ssh_host="127.0.0.1", ssh_port=port), vm)


def leave_cut_change(tx: Tx, vm_id: str, status: VmStatus, change: VmChange,
                     at: datetime) -> None:
    """The row as a crash between a change's start and its end leaves it."""
    vm = tx.vms.get(vm_id)
    assert vm is not None
    assert tx.vms.save(replace(vm, status=status, change=change, change_at=at), vm)
