"""A volume whose host does not answer (SPEC §18): where it may be held from.

A volume's file is on its host's machine (`RIFT_DATA_DIR/volumes/` there). On a host
of this machine it stays reachable when its host's libvirt does not answer:
`rift_volume_delete`, `_resize` and `_clone` work as ever; on a host elsewhere they
wait for the host, and so does every VM that would hold it.
What needs the host is a VM holding it. While the host is unreachable (not lost
yet) a VM that would hold it (`rift_vm_new` with volumes, `rift_vm_attach_volume`)
is refused with `no_capacity` (`VolumeHostDown`), naming the host, since when, and
when it is lost. Once the host is lost (no answer for `RIFT_HOST_LOST_S`: the VMs
that held the volume failed, their attachments with them), the next VM that
would hold it takes it to a host of this machine that answers: the VM's host for
an attach, the first taking VMs (by name) for `rift_vm_new`, where the new VM is
then placed (`Volume.moved`, in the transaction that checks the call).
"""

from __future__ import annotations

from datetime import timedelta

from hypervisor.base import elsewhere
from rift.domain.clock import iso
from rift.domain.errors import VolumeHostDown
from rift.domain.volumes import Volume
from rift.services.context import Deps
from rift.services.lifecycle.volumes import moved
from rift.services.ports import Tx


def answering(deps: Deps, tx: Tx, volume: Volume, want: str | None = None) -> Volume:
    """`volume` on a host that answers (as it is, or taken to `want` or the first host
    of this machine taking VMs once its own is lost; saved in `tx`); VolumeHostDown
    when there is none yet."""
    host = tx.hosts.get(volume.host)
    if host is None or host.unreachable_since is None:
        return volume
    since = host.unreachable_since
    lost_at = since + timedelta(seconds=deps.limits.host_lost_s)
    if elsewhere(host.uri):  # its file is on that host's machine: it waits for it
        raise VolumeHostDown(volume.id, host.name, iso(since) or "", None, elsewhere=True)
    if deps.clock.now() < lost_at or tx.volumes.holders(volume.id):
        raise VolumeHostDown(volume.id, host.name, iso(since) or "",
                             iso(lost_at) if deps.clock.now() < lost_at else None)
    here = [h for h in sorted(tx.hosts.all(), key=lambda h: h.name)
            if not elsewhere(h.uri) and h.unreachable_since is None
            and (h.name == want if want is not None else not h.drained)]
    if not here:
        raise VolumeHostDown(volume.id, host.name, iso(since) or "", None)
    went = volume.moved(here[0].name)
    tx.volumes.save(went, volume)
    moved(tx)
    return went
