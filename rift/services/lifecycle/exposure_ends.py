"""What ends a VM's exposures with it (its ender in rift.services.lifecycle.teardown),
apart from the use cases (`exposures`, which wake a sleeping VM and so import
what teardown is imported by)."""

from __future__ import annotations

from datetime import datetime

from rift.domain.model import Vm
from rift.services.ports import Tx


def end_for_vm(tx: Tx, vm: Vm, now: datetime, actor: str) -> None:
    """The VM ended (rift.services.lifecycle.teardown.vm_ended): its exposures end
    with it, their URLs answering 404 from the commit on."""
    tx.exposures.remove(vm.id)
