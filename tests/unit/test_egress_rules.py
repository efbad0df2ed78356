"""Which egress rules a connection to the egress proxy is under (the engine's answer,
rift.services.read.egress): a running VM's allowlist, found by its libvirt domain,
and none for any other domain (SPEC §13)."""

from __future__ import annotations

from rift.contract import tools as c
from rift.contract.base import command
from rift.services.context import Deps
from rift.services.lifecycle import pauses, tasks, vms
from rift.services.read.egress import egress_rules_for
from tests.support.engine import ALICE


def test_a_running_vm_with_an_allowlist_is_under_its_rules_by_its_domain(deps: Deps) -> None:
    handle = str(tasks.new(deps, ALICE, command(c.TaskNewIn)).handle)
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny",
                                      egress={"allow": ["pypi.org", "10.0.0.0/8"]})).vm
    found = egress_rules_for(deps, f"rift-{vm.id}")
    assert found is not None and found.vm_id == vm.id
    assert found.rules.allows("PyPI.org") and found.rules.allows("10.1.2.3")
    assert not found.rules.allows("example.org") and not found.rules.allows("11.0.0.1")


def test_a_domain_of_no_running_vm_with_an_allowlist_is_under_no_rules(deps: Deps) -> None:
    handle = str(tasks.new(deps, ALICE, command(c.TaskNewIn)).handle)
    opened = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny")).vm
    closed = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny", egress="none")).vm
    paused = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny",
                 egress={"allow": ["pypi.org"]})).vm
    assert pauses.pause(deps, ALICE, command(c.VmHeldIn, handle=handle,
               vm_id=paused.id)).vm.status == "paused"
    gone = vms.new(deps, ALICE, command(c.VmNewIn, handle=handle, image="tiny",
               egress={"allow": ["pypi.org"]})).vm
    vms.destroy(deps, ALICE, command(c.VmDestroyIn, vm_id=gone.id, handle=handle))
    for domain in (f"rift-{opened.id}", f"rift-{closed.id}", f"rift-{paused.id}",
                   f"rift-{gone.id}", "rift-vm_nothere", paused.id, "other-vm"):
        assert egress_rules_for(deps, domain) is None, domain
