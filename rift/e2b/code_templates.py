"""E2B's code interpreter's templates (SPEC §20): the image a sandbox of one starts,
and its code server started with it (rift.e2b.code_interpreter serves its calls)."""

from __future__ import annotations

from rift.domain.errors import RiftError
from rift.services.context import Deps
from rift.services.ports.code import NoPython

TEMPLATES = ("code-interpreter-v1", "code-interpreter")  # E2B's code interpreter's own


def template_image(deps: Deps, template: str) -> str | None:
    """The image a sandbox of E2B's code interpreter template starts: `python` where it
    is built, else RIFT_DEFAULT_IMAGE (None); another template is its own image."""
    if template not in TEMPLATES:
        return template
    return "python" if "python" in deps.images.names() else None


def start_kernel(deps: Deps, vm_id: str) -> None:
    """Start the code server in a code interpreter sandbox's guest (a pooled VM's runs
    already), so its port 49999 answers when reached by name; a guest that cannot is
    left as it is (the door's own routes start it on their first call)."""
    with deps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    if vm is None or vm.status != "running" or vm.ssh_port is None:
        return
    try:
        deps.code.start(vm)
    except (RiftError, NoPython) as exc:
        deps.log.info("no code server in the sandbox", extra={"vm_id": vm_id,
                                                              "error": str(exc)[:200]})
