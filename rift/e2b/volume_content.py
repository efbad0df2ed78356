"""E2B's volume content API through the door (SPEC §16, §18): a volume's files with no
sandbox, as rift.services.lifecycle.volume_content's use cases. Blocking: the routes
run these in worker threads.

`/volumecontent/{id}/dir` (GET: list with `depth`; POST: make a folder, `force`
making its parents), `/path` (GET: stat; PATCH: `{uid, gid, mode}`; DELETE:
remove, a folder with all in it: 204), `/file` (GET: the bytes; PUT: write them,
`force` overwriting), each with `path` in the query, under `Authorization: Bearer
<the volume's token>`. The token the door answers for a volume (rift.e2b.volumes)
is the API key of the call that asked (a Rift API token, which the caller holds
already; nothing is stored): the content API answers the user it names, and only
that user's volumes. An entry is E2B's `VolumeEntryStat` (times in UTC, `mode` its
permission bits). A path not there is 404, one there that may not be (or of the
wrong kind) 409, an attached volume 409 `volume_busy` naming the VM and
`rift_vm_detach_volume`; another user's volume is 404 as an unknown one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hypervisor.volume_content import Entry, Meta
from rift.domain.errors import InvalidArgument, VolumeNotFound
from rift.domain.ids import is_volume_id
from rift.e2b.sandboxes import Registry
from rift.services.context import Caller, Deps
from rift.services.lifecycle import volume_content as content
from rift.services.lifecycle.volume_content import Spot

Query = dict[str, str]


@dataclass(frozen=True)
class Asked:
    """A content call's volume (from its URL) and query (`path` and the rest)."""

    volume_id: str
    query: Query


def entry(found: Entry) -> dict[str, Any]:
    """E2B's `VolumeEntryStat`."""
    def at(seconds: int) -> str:
        return datetime.fromtimestamp(seconds, UTC).isoformat()

    shown: dict[str, Any] = {
        "name": found.name, "type": found.type, "path": found.path, "size": found.size,
        "mode": found.mode, "uid": found.uid, "gid": found.gid, "atime": at(found.atime),
        "mtime": at(found.mtime), "ctime": at(found.ctime)}
    if found.target is not None:
        shown["target"] = found.target
    return shown


def _spot(asked: Asked) -> Spot:
    if not is_volume_id(asked.volume_id):
        raise VolumeNotFound(asked.volume_id)
    path = asked.query.get("path")
    if not path:
        raise InvalidArgument("path", "the path in the volume (a query parameter)")
    return Spot(asked.volume_id, path)


def _int(query: Query, name: str) -> int | None:
    text = query.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise InvalidArgument(name, "a whole number") from exc


def _meta(query: Query) -> Meta:
    return content.meta_of(_int(query, "uid"), _int(query, "gid"), _int(query, "mode"),
                           force=query.get("force", "").lower() == "true")


def listing(deps: Deps, registry: Registry, caller: Caller, asked: Asked) -> list[dict[str, Any]]:
    depth = _int(asked.query, "depth") or 1
    return [entry(e) for e in content.listing(deps, caller, _spot(asked), depth)]


def make_dir(deps: Deps, registry: Registry, caller: Caller, asked: Asked) -> dict[str, Any]:
    meta = _meta(asked.query)
    return entry(content.make_dir(deps, caller, _spot(asked), meta))


def stat(deps: Deps, registry: Registry, caller: Caller, asked: Asked) -> dict[str, Any]:
    return entry(content.stat(deps, caller, _spot(asked)))


def set_meta(deps: Deps, registry: Registry, caller: Caller, asked: Asked,
             body: dict[str, Any]) -> dict[str, Any]:
    wanted = {}
    for name in ("uid", "gid", "mode"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidArgument(name, "a whole number")
        wanted[name] = value
    meta = content.meta_of(wanted["uid"], wanted["gid"], wanted["mode"])
    return entry(content.set_meta(deps, caller, _spot(asked), meta))


def remove(deps: Deps, registry: Registry, caller: Caller, asked: Asked) -> None:
    content.remove(deps, caller, _spot(asked))


def read(deps: Deps, registry: Registry, caller: Caller, asked: Asked) -> bytes:
    return content.read(deps, caller, _spot(asked))


def write(deps: Deps, registry: Registry, caller: Caller, asked: Asked,
          data: bytes) -> dict[str, Any]:
    meta = _meta(asked.query)
    return entry(content.write(deps, caller, _spot(asked), data, meta))
