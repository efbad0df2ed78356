"""The Boxes page's volumes (SPEC §18): each of the person's volumes with its size,
host and the VMs holding it, read-only or writable; and the live stream sends the
page again when a volume changes, though a volume belongs to no task."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime

import pytest

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.services.background.usage import sample_usage
from rift.services.context import Deps
from rift.services.lifecycle import volumes
from rift.services.read import boxes
from tests.support.engine import ALICE, BOB
from tests.support.volumes import Files, Mounts
from tests.support.volumes import attach as _attach
from tests.support.volumes import new_vm as _vm
from tests.support.volumes import new_volume as _volume
from web.render import live_region

CONNECT = {"mcp_url": "http://rift.test/mcp"}


@pytest.fixture
def vdeps(deps: Deps) -> Deps:
    return replace(deps, volume_files=Files(), mounts=Mounts())


def _row(html: str, volume_id: str) -> str:
    start = html.index(f'data-volume="{volume_id}"')
    return html[start:html.index("</tr>", start)]


def _cells(row: str) -> dict[str, str]:
    """Each cell's text by its column (data-h), tags stripped."""
    found = re.findall(r'<td data-h="([^"]+)"[^>]*>(.*?)</td>', row, re.S)
    return {name: re.sub(r"<[^>]+>", "", text).strip() for name, text in found}


def _page(deps: Deps, now: datetime, user: str = ALICE.user) -> str:
    return live_region(boxes.read_page(deps, user), now, CONNECT)


def test_the_page_lists_each_volume_its_size_and_who_holds_it_how(
        vdeps: Deps, clock: FakeClock) -> None:
    task_1, h1, vm_1 = _vm(vdeps)
    task_2, h2, vm_2 = _vm(vdeps)
    written, shared, idle = (_volume(vdeps, "repo", 10), _volume(vdeps, "models", 4),
                             _volume(vdeps, "<b>cache</b>", 1))
    _attach(vdeps, h1, vm_1, written, "/work/repo")
    _attach(vdeps, h1, vm_1, shared, "/models", read_only=True)
    clock.advance(1)  # holders come oldest first
    _attach(vdeps, h2, vm_2, shared, "/models", read_only=True)
    _volume(vdeps, "bobs", 2, caller=BOB)
    html = _page(vdeps, clock.now())
    assert '<h2 id="volumes-h">Volumes <span class="count">3</span></h2>' in html
    assert [_cells(_row(html, v))["Size"] for v in (written, shared, idle)] == [
        "10 GiB", "4 GiB", "1 GiB"]
    assert _cells(_row(html, written))["Attached to"] == (
        f"{vm_1} in {task_1} at /work/repo, writable")
    assert _cells(_row(html, shared))["Attached to"] == (
        f"{vm_1} in {task_1} at /models, read-only"
        f"{vm_2} in {task_2} at /models, read-only")
    assert _cells(_row(html, idle))["Attached to"] == "nowhere"
    assert _cells(_row(html, idle))["Host"] == "local"
    assert _cells(_row(html, idle))["Used"] == "–"  # not sampled yet
    assert "&lt;b&gt;cache&lt;/b&gt;" in _row(html, idle)  # a name is text, never markup
    assert "bobs" not in html
    assert 'id="volumes-h"' not in _page(vdeps, clock.now(), "carol")  # none: no section


def test_each_change_of_a_volume_moves_the_mark_and_the_page(vdeps: Deps) -> None:
    seen = [boxes.read_page(vdeps, ALICE.user)]

    def changed() -> boxes.BoxesPage:
        page = boxes.read_page(vdeps, ALICE.user)
        assert (page.mark, page.digest) != (seen[-1].mark, seen[-1].digest)
        seen.append(page)
        return page

    vol = _volume(vdeps, "work", 2)
    assert [v.id for v in changed().volumes] == [vol]
    volumes.resize(vdeps, ALICE, command(c.VolumeResizeIn, volume_id=vol, size_gib=3))
    assert changed().volumes[0].size_gib == 3
    clone = volumes.clone(vdeps, ALICE, command(c.VolumeCloneIn, volume_id=vol,
                                                name="copy")).volume.id
    assert {v.id for v in changed().volumes} == {vol, clone}
    _, handle, vm_id = _vm(vdeps)
    changed()  # the VM's task
    _attach(vdeps, handle, vm_id, clone, "/copy", read_only=True)
    assert {v.id: [a.vm_id for a in v.attached_to] for v in changed().volumes} == {
        vol: [], clone: [vm_id]}
    volumes.delete(vdeps, ALICE, command(c.VolumeIdIn, volume_id=vol))
    assert [v.id for v in changed().volumes] == [clone]
    _volume(vdeps, "theirs", 1, caller=BOB)
    page = boxes.read_page(vdeps, ALICE.user)
    assert page.mark != seen[-1].mark and page.digest == seen[-1].digest


def test_used_bytes_are_sampled_with_usage_and_shown_once_known(
        vdeps: Deps, clock: FakeClock) -> None:
    files: Files = vdeps.volume_files  # type: ignore[assignment]
    small, big, unknown = (_volume(vdeps, "small", 1), _volume(vdeps, "big", 10),
                           _volume(vdeps, "unknown", 1))
    files.used = {small: 6 << 20, big: 3 << 29}
    before = boxes.read_page(vdeps, ALICE.user)
    sample_usage(vdeps, 60)
    page = boxes.read_page(vdeps, ALICE.user)
    assert page.mark != before.mark
    assert {v.id: v.used_bytes for v in page.volumes} == {
        small: 6 << 20, big: 3 << 29, unknown: None}
    html = live_region(page, clock.now(), CONNECT)
    assert [_cells(_row(html, v))["Used"] for v in (small, big, unknown)] == [
        "6 MiB", "1.5 GiB", "–"]
    got = volumes.get(vdeps, ALICE, command(c.VolumeIdIn, volume_id=big)).volume
    assert got.used_bytes == 3 << 29  # rift_volume_get says it too
    sample_usage(vdeps, 60)  # nothing changed: nothing written, the mark stays
    assert boxes.read_page(vdeps, ALICE.user).mark == page.mark


def test_the_page_says_when_a_volumes_host_does_not_answer(vdeps: Deps,
                                                           clock: FakeClock) -> None:
    from rift.services.background.reconcile import mark_reachable, mark_unreachable

    vol = _volume(vdeps)
    assert "unreachable" not in _row(_page(vdeps, clock.now()), vol)
    before = boxes.read_page(vdeps, ALICE.user).mark
    mark_unreachable(vdeps, "local", "connection refused")
    assert boxes.read_page(vdeps, ALICE.user).mark != before  # open pages read again
    assert _cells(_row(_page(vdeps, clock.now()), vol))["Host"].startswith(
        "local unreachable since")
    before = boxes.read_page(vdeps, ALICE.user).mark
    mark_reachable(vdeps, "local")
    assert boxes.read_page(vdeps, ALICE.user).mark != before
    assert "unreachable" not in _row(_page(vdeps, clock.now()), vol)
