"""Sampling what volumes take on their hosts (SPEC §18's Boxes page): with each
round of usage sampling, every ready volume on a reachable host has its used
bytes read from its files (`VolumeFiles.used_bytes`: the allocated blocks of its
file and of the frozen parents it reads, no process started) and recorded when
they changed; a change moves the Boxes page's volumes mark once a round."""

from __future__ import annotations

from hypervisor.base import ImageError
from rift.domain.model import Host
from rift.services.context import Deps
from rift.services.lifecycle.volumes import moved


def sample_volumes(deps: Deps, host: Host) -> int:
    """Record the used bytes of the host's ready volumes; answers how many changed."""
    with deps.store.read() as tx:
        ready = [v for v in tx.volumes.on_host(host.name) if v.state == "ready"]
    found: dict[str, int] = {}
    for volume in ready:
        try:
            used = deps.volume_files.used_bytes(host.uri, volume.id)
        except (OSError, ImageError) as exc:  # a host whose files this machine does not reach
            deps.log.info("volume usage not sampled", extra={
                "host": host.name, "volume_id": volume.id, "error": str(exc)})
            return 0
        if used is not None and used != volume.used_bytes:
            found[volume.id] = used
    if not found:
        return 0
    with deps.store.write() as tx:
        changed = sum(tx.volumes.record_used(volume_id, used)
                      for volume_id, used in found.items())
        if changed:
            moved(tx)
    return changed
