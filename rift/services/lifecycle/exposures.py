"""Exposures (SPEC §13): `rift_vm_expose` and `rift_vm_unexpose`, and what the
proxy asks of them (`resolve`). An exposure makes one TCP port of a running VM
reachable through Rift at a URL whose secret is its only key: the store keeps
the secret's SHA-256 digest, so the URL is shown once, in expose's answer.
Exposing a port again mints a new URL and ends the old one; destroying the VM
(or closing its task) ends all of its exposures (`exposure_ends`); a pause keeps
them (they answer 503 until the VM is resumed); a fork starts with none."""

from __future__ import annotations

from dataclasses import dataclass

from rift.contract.exposures import ExposureOut, VmPortIn
from rift.contract.vms import VmOut
from rift.domain.ids import new_exposure_id
from rift.domain.model import NewEvent, Vm
from rift.domain.records import Exposure
from rift.domain.secrets import digest, is_exposure_secret, new_exposure_secret
from rift.services.context import Caller, Deps
from rift.services.lifecycle.leases import check_handle, in_write, parse_handle, task_vm
from rift.services.lifecycle.sleeps import awake
from rift.services.ports import Tx
from rift.services.read import views


def expose(deps: Deps, caller: Caller, cmd: VmPortIn) -> ExposureOut:
    """`rift_vm_expose`: expose `port` of a running VM of the handle's task; answers
    the exposure with its URL (the only time it is shown)."""
    parsed = parse_handle(cmd.handle)
    vm_id, port = cmd.vm_id, cmd.port
    secret = new_exposure_secret()
    now = deps.clock.now()

    def work(tx: Tx) -> Exposure:
        task = check_handle(deps, tx, caller, parsed, now)
        vm = task_vm(tx, task, vm_id, running=True)
        made = Exposure(new_exposure_id(), vm.id, task.id, caller.user, port, digest(secret),
                        now)
        replaced = tx.exposures.put(made)
        tx.events.add(NewEvent(task.id, "vm_exposed", now, caller.label,
                               {"vm_id": vm.id, "port": port,
                                "replaced": replaced is not None}))
        return made

    made = awake(deps, caller.label, lambda: in_write(deps.store, work))  # SPEC §17
    return ExposureOut(exposure=views.exposure(made, deps.exposure_urls.url(secret)))


def unexpose(deps: Deps, caller: Caller, cmd: VmPortIn) -> VmOut:
    """`rift_vm_unexpose`: end the exposure of `port` (a port not exposed changes
    nothing); answers the VM."""
    parsed = parse_handle(cmd.handle)
    vm_id, port = cmd.vm_id, cmd.port
    now = deps.clock.now()

    def work(tx: Tx) -> VmOut:
        task = check_handle(deps, tx, caller, parsed, now)
        vm = task_vm(tx, task, vm_id, running=False)
        if tx.exposures.remove(vm.id, port):
            tx.events.add(NewEvent(task.id, "vm_unexposed", now, caller.label,
                                   {"vm_id": vm.id, "port": port}))
        return VmOut(vm=views.vm(tx, vm))

    return in_write(deps.store, work)


@dataclass(frozen=True)
class Target:
    """What a secret reaches: the VM (as it is now) and its port."""

    vm: Vm
    port: int


def resolve(deps: Deps, secret: str) -> Target | None:
    """The VM and port of a live exposure's secret; None for any other text (never
    seen, ended, its VM gone): the proxy answers all of them alike."""
    if not is_exposure_secret(secret):
        secret = ""  # looked up all the same: an unknown secret costs what a known one does
    with deps.store.read() as tx:
        found = tx.exposures.by_digest(digest(secret))
        vm = None if found is None else tx.vms.get(found.vm_id)
    if found is None or vm is None or vm.status in ("destroyed", "failed"):
        return None
    return Target(vm, found.port)
