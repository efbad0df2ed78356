"""Builds and the images they made (``tx.builds``, ``tx.owned_images``, migration
0019) on every database: a build's transitions are compare-and-sets on its state,
its log reads back, and an image's owner and publication are kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rift.domain.builds import Build, OwnedImage, layer_name
from rift.domain.errors import IllegalTransition
from rift.domain.store_errors import DuplicateKey
from rift.services.ports import Store

T0 = datetime(2026, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def a_build(build_id: str = "build_abcdefgh", owner: str = "ada", after: float = 0) -> Build:
    return Build(id=build_id, image="node", owner=owner, host="local", state="running",
                 recipe="FROM tiny\nRUN true\n", no_cache=False,
                 created_at=T0 + timedelta(seconds=after), steps=1)


def test_a_build_logs_and_ends_once_by_compare_and_set(store: Store) -> None:
    build = a_build()
    with store.write() as tx:
        tx.builds.add(build)
        logged = build.logged("step 1/1: RUN true\n", cached=0)
        assert tx.builds.save(logged, build) is True
        done = logged.succeeded(T0 + timedelta(seconds=3))
        failed = logged.failed("cut", T0)
        assert tx.builds.save(done, logged) is True
        assert tx.builds.save(failed, logged) is False  # the row left `running`
        assert tx.builds.get(build.id) == done
        assert tx.builds.running() == []
    with pytest.raises(IllegalTransition):
        done.failed("again", T0)


def test_builds_list_under_their_owner_newest_first_and_running_ones_are_found(
        store: Store) -> None:
    with store.write() as tx:
        tx.builds.add(a_build("build_aaaaaaaa", after=1))
        tx.builds.add(a_build("build_bbbbbbbb", after=2))
        tx.builds.add(a_build("build_cccccccc", owner="bob"))
        with pytest.raises(DuplicateKey):
            tx.builds.add(a_build("build_aaaaaaaa"))
    with store.read() as tx:
        assert [b.id for b in tx.builds.of_owner("ada")] == ["build_bbbbbbbb", "build_aaaaaaaa"]
        assert {b.id for b in tx.builds.running()} == {
            "build_aaaaaaaa", "build_bbbbbbbb", "build_cccccccc"}


def test_an_image_is_its_owners_until_published_and_a_layer_is_no_ones(store: Store) -> None:
    image = OwnedImage("node", "ada", "image", False, "build_abcdefgh", None, T0)
    layer = OwnedImage(layer_name("f" * 64), "ada", "layer", False, None, "f" * 64, T0)
    with store.write() as tx:
        tx.owned_images.add(image)
        tx.owned_images.add(layer)
    assert image.visible_to("ada") and not image.visible_to("bob")
    assert not layer.visible_to("ada")
    with store.write() as tx:
        assert tx.owned_images.save(image.publish(), image) is True
        assert tx.owned_images.save(image.publish(), image) is False
    with store.read() as tx:
        got = tx.owned_images.get("node")
        assert got is not None and got.visible_to("bob")
        assert [i.name for i in tx.owned_images.all()] == [layer.name, "node"]
    with store.write() as tx:
        assert tx.owned_images.remove(layer.name) is True
        assert tx.owned_images.get(layer.name) is None
