"""Snapshots, forks and network rules through the E2B door (SPEC §12, §13, §16), on a
real `rift serve` over libvirt's test driver (VMs with no guest behind them), driven
by E2B's own SDK: a snapshot is listed, by sandbox and by name, and deleted once;
a sandbox made from it, and each fork, is a sandbox of the same user in a task of
its own; a killed sandbox's snapshot outlives it; `allow_internet_access` and
`network` become the VM's egress (deny lists Rift cannot keep are refused, never
dropped). What the guests see of it: tests/e2e/test_real_e2b_forks.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import InvalidArgumentException, Sandbox, SandboxNetworkOpts, Volume
from e2b.exceptions import SandboxException, SandboxNotFoundException

from tests.support.e2b import Door, e2b_opts
from tests.support.e2b import door as served


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    with served(tmp_path_factory.mktemp("e2b-snapshots")) as made:
        yield made


def test_a_snapshot_is_listed_by_sandbox_and_name_and_deleted_once(door: Door) -> None:
    sbx = Sandbox.create(**door.opts)
    other = Sandbox.create(**door.opts)
    try:
        named = sbx.create_snapshot(name="before-upgrade")
        plain = Sandbox.create_snapshot(other.sandbox_id, **door.opts)
        assert named.snapshot_id.startswith("snap_") and named.names == ["before-upgrade"]
        assert door.task(sbx)["snapshots"][0]["id"] == named.snapshot_id  # Rift's own view
        everything = [s.snapshot_id for s in Sandbox.list_snapshots(**door.opts).next_items()]
        assert {named.snapshot_id, plain.snapshot_id} <= set(everything)
        assert [s.snapshot_id for s in sbx.list_snapshots().next_items()] == [named.snapshot_id]  # type: ignore[misc]
        assert [s.snapshot_id for s in Sandbox.list_snapshots(
            name="before-upgrade", **door.opts).next_items()] == [named.snapshot_id]
        assert Sandbox.list_snapshots(name="nothing-so-named", **door.opts).next_items() == []
        pages = Sandbox.list_snapshots(limit=1, **door.opts)
        first = pages.next_items()
        assert len(first) == 1 and pages.has_next
        assert Sandbox.delete_snapshot(named.snapshot_id, **door.opts) is True
        assert Sandbox.delete_snapshot(named.snapshot_id, **door.opts) is False
        assert door.task(sbx)["snapshots"] == [] and sbx.is_running()
        stranger = e2b_opts(door.srv.url, door.srv.new_token("bob", "bobs-script"))
        assert Sandbox.list_snapshots(**stranger).next_items() == []
        assert Sandbox.delete_snapshot(plain.snapshot_id, **stranger) is False
        assert Sandbox.delete_snapshot(plain.snapshot_id, **door.opts) is True
    finally:
        sbx.kill()
        other.kill()


def test_a_sandbox_from_a_snapshot_is_a_task_of_its_own_and_outlives_its_source(
        door: Door) -> None:
    sbx = Sandbox.create(metadata={"kind": "source"}, **door.opts)
    snap = sbx.create_snapshot()
    made = Sandbox.create(snap.snapshot_id, timeout=120, **door.opts)
    try:
        vm, task = door.vm(made), door.task(made)
        assert vm["start"]["kind"] == "fork" and task["id"] != door.task(sbx)["id"]
        assert task["name"] == f"e2b {snap.snapshot_id}" and task["holder"].startswith("e2b:")
        assert made.get_info().template_id == snap.snapshot_id
        source_task = door.task(sbx)["id"]
        sbx.kill()  # its task stays open for its snapshot
        assert door.rest(f"tasks/{source_task}")["task"]["status"] == "open"
        vol = Volume.create("fork-data", **door.opts)  # volumeMounts: attached to the fork
        again = Sandbox.create(snap.snapshot_id, volume_mounts={"/data": vol}, **door.opts)
        forked = door.vm(again)
        assert forked["start"]["kind"] == "fork" and forked["volumes"] == [
            {"volume_id": vol.volume_id, "path": "/data", "read_only": False}]
        again.kill()
        with pytest.raises(SandboxException, match="invalid_argument"):  # a path refused
            Sandbox.create(snap.snapshot_id, volume_mounts={"/etc": vol}, **door.opts)
        assert door.rest(f"volumes/{vol.volume_id}")["volume"]["attached_to"] == []
        assert Volume.destroy(vol.volume_id, **door.opts)
        assert Sandbox.delete_snapshot(snap.snapshot_id, **door.opts) is True
        assert door.rest(f"tasks/{source_task}")["task"]["status"] == "closed"  # kept for none
        with pytest.raises(SandboxException):  # the snapshot is gone
            Sandbox.create(snap.snapshot_id, **door.opts)
    finally:
        made.kill()


def test_forks_are_sandboxes_of_their_own_with_their_sources_metadata(door: Door) -> None:
    sbx = Sandbox.create(metadata={"suite": "forks"}, **door.opts)
    try:
        forks = sbx.fork(count=2, timeout=60)
        assert all(isinstance(f, Sandbox) for f in forks), forks
        made = [f for f in forks if isinstance(f, Sandbox)]
        try:
            ids = {f.sandbox_id for f in made}
            assert len(ids) == 2 and sbx.sandbox_id not in ids
            tasks = {door.task(f)["id"] for f in made} | {door.task(sbx)["id"]}
            assert len(tasks) == 3  # a task each
            assert all(door.vm(f)["start"]["kind"] == "fork" for f in made)
            assert all(f.get_info().metadata == {"suite": "forks"} for f in made)
            assert sbx.is_running() and door.task(sbx)["snapshots"] == []  # its snapshot went
            listed = {s.sandbox_id for s in Sandbox.list(**door.opts).next_items()}
            assert ids | {sbx.sandbox_id} <= listed
        finally:
            for f in made:
                f.kill()
        with pytest.raises(InvalidArgumentException):
            Sandbox.fork(sbx.sandbox_id, count=0, **door.opts)
        too_many = httpx.post(f"{door.srv.url}/e2b/sandboxes/{sbx.sandbox_id}/fork",
                              headers={"X-API-Key": door.srv.token}, json={"count": 21},
                              timeout=30)
        assert too_many.status_code == 400 and "count" in too_many.json()["message"]
    finally:
        sbx.kill()
    with pytest.raises(SandboxNotFoundException):
        sbx.fork()


def test_network_rules_become_the_vms_egress(door: Door) -> None:
    """Open and none here (an allowlisted guest needs a real host: the mapping's every
    case is tests/unit/test_e2b_network.py, an allowlist's effect test_real_e2b_forks)."""
    cases: list[tuple[dict[str, Any], object]] = [
        ({}, "open"),
        ({"allow_internet_access": True}, "open"),
        ({"allow_internet_access": False}, "none"),
        ({"network": SandboxNetworkOpts(deny_out=lambda ctx: [ctx.all_traffic])}, "none"),
        ({"network": SandboxNetworkOpts(deny_out=["10.1.2.3"], allow_out=["10.0.0.0/8"])},
         "open"),  # allowed entries win: nothing is left denied
    ]
    for options, egress in cases:
        sbx = Sandbox.create(**options, **door.opts)
        try:
            assert door.vm(sbx)["egress"] == egress, options
        finally:
            sbx.kill()


def test_network_rules_rift_cannot_keep_are_refused_not_dropped(door: Door) -> None:
    before = len(door.rest("tasks?status=open")["tasks"])
    with pytest.raises(SandboxException) as deny:  # E2B's 400
        Sandbox.create(network=SandboxNetworkOpts(deny_out=["8.8.8.8"]), **door.opts)
    assert str(deny.value).startswith("400") and "allowOut" in str(deny.value)
    with pytest.raises(SandboxException) as rules:
        Sandbox.create(network={"rules": {"example.com": [
            {"transform": {"headers": {"X-Token": "v"}}}]}}, **door.opts)
    assert str(rules.value).startswith("501") and "network.rules" in str(rules.value)
    assert len(door.rest("tasks?status=open")["tasks"]) == before  # nothing was made
    sbx = Sandbox.create(**door.opts)
    try:
        with pytest.raises(SandboxException) as update:
            sbx.update_network({"deny_out": ["8.8.8.8"]})
        assert "set when it is made" in str(update.value)
        snap = sbx.create_snapshot()
        with pytest.raises(SandboxException) as kept:  # a fork keeps its source's egress
            Sandbox.create(snap.snapshot_id, allow_internet_access=False, **door.opts)
        assert str(kept.value).startswith("400")
        Sandbox.delete_snapshot(snap.snapshot_id, **door.opts)
    finally:
        sbx.kill()
