"""Whose images are whose (SPEC §19): an image a build made is its builder's until
`rift image publish`; a layer (`layer-<key>`) only its owner's builds start. An
image with no row (tiny, debian, an operator's `rift image add`) is everyone's.
Others get `image_not_found`, as for an image that is not there (no probing)."""

from __future__ import annotations

from dataclasses import dataclass

from rift.domain.builds import LAYER_PREFIX, OwnedImage
from rift.domain.errors import ImageNotFound
from rift.services.context import Caller, Deps
from rift.services.ports import Tx


@dataclass(frozen=True)
class BuildCaller(Caller):
    """A build's own calls, as its user: only they start VMs of that user's layers."""


def sees(row: OwnedImage | None, caller: Caller, name: str = "") -> bool:
    if row is None:  # everyone's, but a layer a crash left without its row: no one's
        return not name.startswith(LAYER_PREFIX)
    if row.kind == "layer":
        return isinstance(caller, BuildCaller) and row.owner == caller.user
    return row.visible_to(caller.user)


def visible_names(deps: Deps, tx: Tx, caller: Caller) -> list[str]:
    """The images the caller may start, by name."""
    owned = {row.name: row for row in tx.owned_images.all()}
    return sorted(n for n in deps.images.names() if sees(owned.get(n), caller, n))


def check_visible(deps: Deps, tx: Tx, caller: Caller, image: str) -> None:
    """ImageNotFound unless the catalog knows `image` and the caller may start it."""
    if image in deps.images.names() and sees(tx.owned_images.get(image), caller, image):
        return
    raise ImageNotFound(image, visible_names(deps, tx, caller))
