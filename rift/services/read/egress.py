"""Which egress rules a proxied guest's connection is under (SPEC §13): the egress
proxy (rift.proxy) finds the libvirt domain whose QEMU holds the connection's other
end, and asks here what that domain's VM may reach. Only a running VM with an
allowlist has any; every other connection is refused (`unknown_vm`)."""

from __future__ import annotations

from dataclasses import dataclass

from rift.domain import egress
from rift.services.context import Deps

DOMAIN_PREFIX = "rift-"  # a VM's libvirt domain is `rift-<vm id>` (Vm.domain_name)


@dataclass(frozen=True)
class GuestEgress:
    """A running VM whose guest reaches the networks only through the proxy, and
    what its allowlist lets it reach."""

    vm_id: str
    rules: egress.Allowlist


def egress_rules_for(deps: Deps, domain: str) -> GuestEgress | None:
    """The allowlist of the running VM libvirt domain `domain` is, or None when it is
    no VM's, or its VM is not running or has no allowlist (`open`, `none`)."""
    if not domain.startswith(DOMAIN_PREFIX):
        return None
    with deps.store.read() as tx:
        vm = tx.vms.get(domain[len(DOMAIN_PREFIX):])
    if vm is None or vm.status != "running":
        return None
    rules = egress.allowlist(vm.egress)
    return None if rules is None else GuestEgress(vm.id, rules)
