"""Removing an operator's image, which the engine refuses while a live VM was made
from it. (`rift image add` needs no engine: hypervisor.qcow2.add_qcow2.)"""

from __future__ import annotations

from pathlib import Path

from hypervisor.base import ImageError
from hypervisor.qcow2 import remove_image as remove_image_files
from rift.domain.errors import InvalidArgument
from rift.services.context import Deps


def _images_dir(deps: Deps) -> Path:
    if deps.runtime is None:
        raise InvalidArgument("image", "this control plane runs no real guests (no guest "
                              "runtime), so it keeps no images")
    return deps.runtime.images_dir


def live_vms_of_image(deps: Deps, name: str) -> list[str]:
    """Ids of the live (creating or running) VMs made from image `name`, on any host."""
    with deps.store.read() as tx:
        return sorted(vm.id for host in tx.hosts.all()
                      for vm in tx.vms.live_on_host(host.name) if vm.image == name)


def remove_image(deps: Deps, name: str) -> None:
    """Delete image `name`, unless a live VM was made from it (its overlay reads the
    image; destroy the VM, or close its task, first)."""
    images_dir = _images_dir(deps)
    users = live_vms_of_image(deps, name)
    if users:
        raise InvalidArgument("image", f"image {name!r} is in use by live VMs "
                              f"{', '.join(users)}; destroy them (rift task close) first")
    try:
        remove_image_files(images_dir, name)
    except ImageError as exc:
        raise InvalidArgument("image", str(exc)) from exc
