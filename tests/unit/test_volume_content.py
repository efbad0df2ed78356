"""The volume content use cases (rift.services.lifecycle.volume_content) on fakes:
only the caller's volume, only while no VM holds it (`volume_busy` naming the VM
and rift_vm_detach_volume), its path made normal, a missing or taken path refused
as `invalid_argument` of its own kind, and the port given the volume's file."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from hypervisor.volume_content import Entry, Meta
from rift.services.context import Deps
from rift.services.lifecycle import volume_content as content
from rift.services.lifecycle.volume_content import Spot
from tests.support.engine import ALICE, BOB, refused
from tests.support.volumes import Files, Mounts
from tests.support.volumes import attach as _attach
from tests.support.volumes import new_vm as _vm
from tests.support.volumes import new_volume as _volume

FILE = Entry("note", "file", "/src/note", 5, 0o644, 0, 0, 1, 1, 1)


@dataclass
class Content:
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def stat(self, uri: str, volume_file: str, path: str) -> Entry:
        self.calls.append(("stat", volume_file, path))
        if path == "/gone":
            raise FileNotFoundError(path)
        return replace(FILE, path=path)

    def write(self, uri: str, volume_file: str, path: str, data: bytes, meta: Meta) -> Entry:
        self.calls.append(("write", volume_file, path))
        if not meta.force:
            raise FileExistsError(path)
        return replace(FILE, path=path, size=len(data))


@pytest.fixture
def vdeps(deps: Deps) -> Deps:
    return replace(deps, volume_files=Files(), mounts=Mounts(), volume_content=Content())  # type: ignore[arg-type]


def test_a_detached_volumes_files_are_the_callers_only_and_not_while_attached(
        vdeps: Deps) -> None:
    files: Content = vdeps.volume_content  # type: ignore[assignment]
    vol = _volume(vdeps)
    assert content.stat(vdeps, ALICE, Spot(vol, "//src/./note")).path == "/src/note"
    assert files.calls == [("stat", f"/volumes/{vol}.qcow2", "/src/note")]
    refused("volume_not_found", content.stat, vdeps, BOB, Spot(vol, "/src/note"))
    missing = refused("invalid_argument", content.stat, vdeps, ALICE, Spot(vol, "/gone"))
    assert missing.status == 404 and "/gone" in missing.message
    taken = refused("invalid_argument", content.write, vdeps, ALICE, Spot(vol, "/src/note"),
                    b"hello", Meta())
    assert taken.status == 409
    assert content.write(vdeps, ALICE, Spot(vol, "/src/note"), b"hello",
                         Meta(force=True)).size == 5
    refused("invalid_argument", content.write, vdeps, ALICE, Spot(vol, "/"), b"x",
            Meta(force=True))
    refused("invalid_argument", content.stat, vdeps, ALICE, Spot(vol, '/a"b'))
    refused("invalid_argument", content.meta_of, None, None, 0o17777)
    before = len(files.calls)
    _, handle, vm_id = _vm(vdeps)
    _attach(vdeps, handle, vm_id, vol, "/data", read_only=True)
    busy = refused("volume_busy", content.stat, vdeps, ALICE, Spot(vol, "/src/note"))
    assert busy.details["vm_id"] == vm_id and "rift_vm_detach_volume" in busy.hint
    assert len(files.calls) == before  # nothing reached the volume's file once attached
