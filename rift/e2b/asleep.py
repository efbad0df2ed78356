"""A sandbox asleep since its end (`autoPause`, rift.e2b.deadlines.sleep_at_end):
E2B's `paused`, and `autoResume` says who may wake it.

Its VM sleeps (SPEC §17) and its end was dropped as it fell asleep, which is how
it is told from a VM asleep for Rift's own quiet time (`RIFT_TASK_SLEEP_S`): that
one stays `running` to E2B, and any call wakes it. An auto-paused sandbox:

- reads `paused` in the detail and the list (`state_of`);
- `connect` wakes it (rift.e2b.lifecycle), and its end starts again;
- with `autoResume`, any data-plane call or request to a port wakes it too, its end
  starting again at E2B's default timeout; without, those are refused 502 as E2B's
  proxy refuses a paused sandbox's traffic (`admit`), and `/health` says 502, so
  the SDK's `is_running()` is False.
"""

from __future__ import annotations

from datetime import timedelta

from rift.domain.errors import VmNotRunning
from rift.domain.model import Vm
from rift.domain.sandboxes import Sandbox
from rift.e2b import shapes
from rift.e2b.sandboxes import DEFAULT_TIMEOUT_S, LIVE
from rift.services.context import Deps
from rift.services.ports import Tx


class SandboxPaused(VmNotRunning):
    """A call to an auto-paused sandbox without `autoResume`: E2B's 502."""

    status = 502

    def __init__(self, vm_id: str) -> None:
        super().__init__(vm_id, "sleeping")
        self.message = (f"sandbox {shapes.sandbox_id(vm_id)} is paused (asleep since its "
                        "end, autoResume off)")
        self.hint = "Sandbox.connect resumes it"


def paused(status: str, record: Sandbox | None) -> bool:
    """Whether a VM of this status is its sandbox asleep since its end."""
    return (status == "sleeping" and record is not None and record.on_timeout == "pause"
            and record.end_at is None)


def state_of(status: str, record: Sandbox | None) -> str:
    """E2B's state of a live sandbox's VM (a status in LIVE)."""
    return "paused" if paused(status, record) else LIVE[status]


def paused_in(tx: Tx, vm_id: str) -> Sandbox | None:
    """The sandbox's record when it is asleep since its end, read in the caller's
    transaction (no read of its own on every data-plane call); else None."""
    record = tx.sandboxes.get(vm_id)
    vm: Vm | None = tx.vms.get(vm_id) if record is not None else None
    return record if vm is not None and paused(vm.status, record) else None


def admit(deps: Deps, record: Sandbox | None) -> None:
    """Before a data-plane call or a port's request reaches a sandbox asleep since its
    end (`record`, from `paused_in`; None passes): with `autoResume` its end starts
    again (the call then wakes its VM, as any call wakes a sleeping one), without
    it `SandboxPaused`."""
    if record is None:
        return
    if not record.auto_resume:
        raise SandboxPaused(record.vm_id)
    with deps.store.write() as tx:
        tx.sandboxes.set_end(record.vm_id,
                             deps.clock.now() + timedelta(seconds=DEFAULT_TIMEOUT_S))
