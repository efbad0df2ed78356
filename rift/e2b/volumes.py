"""E2B's volumes through the door (SPEC §16, §18), as Rift's volume use cases.
Blocking: the routes run these in worker threads.

- **The API** (`X-API-Key`): `POST /volumes` (`{name}`: 201, E2B's `VolumeAndToken`)
  is `rift_volume_new` of `E2B_VOLUME_GIB` GiB (E2B's volumes have no size; Rift's
  is sparse, counted whole against the disk budget, and grows with
  `rift_volume_resize`); `GET /volumes` (`[{volumeID, name}]`, oldest first) is
  `rift_volume_list`; `GET /volumes/{id}` is `rift_volume_get`; `DELETE
  /volumes/{id}` (204) is `rift_volume_delete` (409 while attached, naming the
  VM). The volume id is Rift's (`vol_…`); an id that is not one is 404, as an
  unknown one.
- **The token** E2B answers authorizes its volume content API (files in a volume
  with no sandbox: rift.e2b.volume_content): the door answers the API key the call
  came with (a Rift API token the caller holds already; nothing is stored), so the
  content API answers that user, for that user's volumes only.
- **`volumeMounts`** on a sandbox's create: rift.e2b.volume_mounts.
"""

from __future__ import annotations

from typing import Any

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.views import VolumeView
from rift.domain.errors import InvalidArgument, VolumeNotFound
from rift.domain.ids import is_volume_id
from rift.e2b.sandboxes import Registry
from rift.services.context import Caller, Deps
from rift.services.lifecycle import volumes

E2B_VOLUME_GIB = 10  # E2B asks for no size: sparse, so it takes what is written


def _and_token(volume: VolumeView, key: str | None) -> dict[str, Any]:
    """E2B's `VolumeAndToken` (no `domain`: only E2B's own clusters answer one); the
    token is the caller's own key, the content API's bearer."""
    return {"volumeID": volume.id, "name": volume.name, "token": key or ""}


def _volume_id(text: str) -> str:
    if not is_volume_id(text):
        raise VolumeNotFound(text)
    return text


def create(deps: Deps, registry: Registry, caller: Caller, body: dict[str, Any],
           key: str | None) -> dict[str, Any]:
    """POST /volumes: an empty ext4 volume of E2B_VOLUME_GIB named `name`."""
    name = body.get("name")
    if not isinstance(name, str):
        raise InvalidArgument("name", "the volume's name (a string)")
    made = volumes.new(deps, caller, command(c.VolumeNewIn, name=name,
                                             size_gib=E2B_VOLUME_GIB))
    return _and_token(made.volume, key)


def listing(deps: Deps, registry: Registry, caller: Caller) -> list[dict[str, Any]]:
    """GET /volumes: the caller's volumes, oldest first."""
    found = volumes.list_volumes(deps, caller, c.VolumeListIn()).volumes
    return [{"volumeID": v.id, "name": v.name} for v in found]


def info(deps: Deps, registry: Registry, caller: Caller, volume_id: str,
         key: str | None) -> dict[str, Any]:
    """GET /volumes/{id}."""
    found = volumes.get(deps, caller, c.VolumeIdIn(volume_id=_volume_id(volume_id)))
    return _and_token(found.volume, key)


def delete(deps: Deps, registry: Registry, caller: Caller, volume_id: str) -> None:
    """DELETE /volumes/{id}: refused while attached (409, naming the VM)."""
    volumes.delete(deps, caller, c.VolumeIdIn(volume_id=_volume_id(volume_id)))
