"""Which layers stay (SPEC §19: layers and images no image uses are swept).

A layer row's `build_id` is the last build that made or reused it
(`mark_reused`). After each build, with the build lock held, `sweep` keeps the
layers of each image name's latest build (succeeded, failed or running: a failed
one's layers are the next try's cache) and every layer their disks back onto,
and removes the rest, files and row: nothing kept is an overlay on anything
removed. Rows of built images whose files are gone (`rift image remove`) go too,
so the name is free again, and so do the layers a cut build left half-written or
saved without their row (`sweep` runs with the build lock held: no build is
saving one then)."""

from __future__ import annotations

from rift.domain.builds import OwnedImage, layer_name
from rift.services.context import Deps
from rift.services.ports.builds import LayerFiles

LATEST_PER_OWNER = 500  # builds read per owner to find each image's latest


def found(deps: Deps, files: LayerFiles, owner: str, keys: list[str]) -> dict[str, str]:
    """Each key's layer of `owner`'s that is there: its own name, else the newest
    made under a build's name (a `no_cache` build's, beside one of the key since
    removed)."""
    with deps.store.read() as tx:
        rows = [r for r in tx.owned_images.all()
                if r.kind == "layer" and r.owner == owner and r.layer_key in keys]
    answer: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: (r.created_at, r.name == layer_name(r.layer_key or ""))):
        if row.layer_key is not None and files.exists(row.name):
            answer[row.layer_key] = row.name
    return answer


def mark_reused(deps: Deps, build_id: str, names: list[str]) -> None:
    """The layers a build reuses are its own now (for `sweep`)."""
    with deps.store.write() as tx:
        for name in names:
            row = tx.owned_images.get(name)
            if row is not None and row.kind == "layer" and row.build_id != build_id:
                tx.owned_images.save(OwnedImage(row.name, row.owner, row.kind, row.published,
                                                build_id, row.layer_key, row.created_at), row)


def sweep(deps: Deps, files: LayerFiles) -> list[str]:
    """Remove the layers no image's latest build uses (and no kept layer backs onto)
    and the rows of removed images; answers the names removed."""
    with deps.store.read() as tx:
        rows = tx.owned_images.all()
        latest: set[str] = set()
        for owner in {r.owner for r in rows}:
            seen: set[str] = set()
            for build in tx.builds.of_owner(owner, LATEST_PER_OWNER):
                if build.image not in seen:
                    seen.add(build.image)
                    latest.add(build.id)
    layers = {r.name: r for r in rows if r.kind == "layer"}
    kept = {name for name, r in layers.items() if r.build_id in latest}
    todo = list(kept)
    while todo:  # and what their disks back onto
        parent = files.backing(todo.pop())
        if parent in layers and parent not in kept:
            kept.add(parent)
            todo.append(parent)
    gone = [name for name in layers if name not in kept]
    gone += [r.name for r in rows if r.kind == "image" and not files.exists(r.name)]
    for name in gone:
        files.remove(name)
        with deps.store.write() as tx:
            tx.owned_images.remove(name)
    # A cut build's leftovers: a layer half-written, or saved with no row yet. With the
    # build lock held no build is saving one, so no row means no one's.
    orphans = [name for name in files.stray() if name not in layers]
    for name in orphans:
        files.remove(name)
    if gone or orphans:
        deps.log.info("layers swept", extra={"removed": len(gone), "orphans": len(orphans)})
    return gone + orphans
