"""Volumes (SPEC §18) through every door on SQLite and libvirt's test driver: REST,
MCP and the `rift volume` command reach the same use cases; the volume's file is
real (mkfs.ext4, qemu-img) under the data dir; the test driver's domains run no
guest, so an attach plugs and mounts nothing there, and the rows and views are
what is checked."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from hypervisor import write_test_host_xml
from rift.app import create_app
from rift.bootstrap import build_deps, close_deps
from rift.cli import main
from rift.config import Settings
from rift.services.access import accounts
from rift.services.context import Deps
from tests.support.raw_mcp import call_tool

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("qemu-img", "mkfs.ext4")),
    reason="needs qemu-img and mkfs.ext4 (scripts/libvirt.sh installs them)")


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    uri = write_test_host_xml(str(tmp_path / "node.xml"), 8, 8192)
    monkeypatch.setenv("RIFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RIFT_HYPERVISOR_URI", uri)
    monkeypatch.setenv("RIFT_MAX_DISK_GIB_PER_USER", "20")
    return Settings()


@pytest.fixture
def deps(settings: Settings) -> Iterator[Deps]:
    made = build_deps(settings)
    try:
        yield made
    finally:
        close_deps(made)


def test_every_door_makes_attaches_and_deletes_the_same_volumes(
        settings: Settings, deps: Deps, capsys: pytest.CaptureFixture[str]) -> None:
    accounts.add_user(deps, "ada", "correct horse battery")
    token = accounts.new_token(deps, "ada").token.value
    rest = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(settings, deps), base_url="http://127.0.0.1") as client:
        made = client.post("/api/v1/volumes", headers=rest, json={"name": "work",
                                                                  "size_gib": 8})
        assert made.status_code == 201, made.text
        vol = made.json()["volume"]
        assert Path(settings.data_dir, "volumes", f"{vol['id']}.qcow2").is_file()
        over = client.post("/api/v1/volumes", headers=rest, json={"name": "big",
                                                                  "size_gib": 13})
        assert (over.status_code, over.json()["error"]["code"]) == (429, "quota_exceeded")

        opened = client.post("/api/v1/tasks", headers=rest, json={}).json()
        task_id, handle = opened["task"]["id"], opened["handle"]
        held = rest | {"Rift-Handle": handle}
        vm = client.post(f"/api/v1/tasks/{task_id}/vms", headers=held, json={}).json()["vm"]
        attached = client.post(f"/api/v1/vms/{vm['id']}/volumes", headers=held,
                               json={"volume_id": vol["id"], "path": "/data"})
        assert attached.status_code == 200, attached.text
        assert attached.json()["vm"]["volumes"] == [
            {"volume_id": vol["id"], "path": "/data", "read_only": False}]

        second = client.post(f"/api/v1/tasks/{task_id}/vms", headers=held, json={}).json()
        busy = call_tool(client, token, "rift_vm_attach_volume", {
            "handle": handle, "vm_id": second["vm"]["id"], "volume_id": vol["id"],
            "path": "/data", "read_only": True})
        assert busy["isError"] is True
        assert busy["structuredContent"]["error"]["code"] == "volume_busy"
        assert busy["structuredContent"]["error"]["vm_id"] == vm["id"]
        deleting = client.delete(f"/api/v1/volumes/{vol['id']}", headers=rest)
        assert (deleting.status_code, deleting.json()["error"]["code"]) == (409, "volume_busy")

        listed = call_tool(client, token, "rift_volume_list", {})["structuredContent"]["volumes"]
        assert [(v["id"], v["attached_to"][0]["vm_id"]) for v in listed] == [
            (vol["id"], vm["id"])]
        assert main(["volume", "list", "--user", "ada", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["attached_to"][0]["path"] == "/data"

        closed = client.post(f"/api/v1/tasks/{task_id}/close", headers=held, json={})
        assert closed.status_code == 200, closed.text
        got = client.get(f"/api/v1/volumes/{vol['id']}", headers=rest).json()["volume"]
        assert got["attached_to"] == []
        events = client.get(f"/api/v1/tasks/{task_id}/events", headers=rest).json()["events"]
        assert [e["type"] for e in events].count("volume_detached") == 1

        assert main(["volume", "clone", vol["id"], "--user", "ada", "--name", "copy"]) == 0
        assert "copy" in capsys.readouterr().out
        over = client.post(f"/api/v1/volumes/{vol['id']}/resize", headers=rest,
                           json={"size_gib": 13})  # 13 and its clone's 8 are over 20
        assert (over.status_code, over.json()["error"]["code"]) == (429, "quota_exceeded")
        grown = client.post(f"/api/v1/volumes/{vol['id']}/resize", headers=rest,
                            json={"size_gib": 9})
        assert grown.json()["volume"]["size_gib"] == 9, grown.text
        gone = client.delete(f"/api/v1/volumes/{vol['id']}", headers=rest)
        assert gone.status_code == 200, gone.text
        assert not Path(settings.data_dir, "volumes", f"{vol['id']}.qcow2").exists()
        others = client.get("/api/v1/volumes", headers=rest).json()["volumes"]
        assert [(v["name"], v["parent_id"]) for v in others] == [("copy", vol["id"])]


def test_rift_vm_new_attaches_volumes_at_both_doors(settings: Settings, deps: Deps) -> None:
    accounts.add_user(deps, "ada", "correct horse battery")
    token = accounts.new_token(deps, "ada").token.value
    rest = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(settings, deps), base_url="http://127.0.0.1") as client:
        work, data = (client.post("/api/v1/volumes", headers=rest, json={
            "name": name, "size_gib": 1}).json()["volume"]["id"] for name in ("work", "data"))
        opened = client.post("/api/v1/tasks", headers=rest, json={}).json()
        task_id, handle = opened["task"]["id"], opened["handle"]
        held = rest | {"Rift-Handle": handle}
        made = client.post(f"/api/v1/tasks/{task_id}/vms", headers=held, json={
            "volumes": [{"volume_id": work, "path": "/work"}]})
        assert made.status_code in (200, 201), made.text
        assert made.json()["vm"]["volumes"] == [
            {"volume_id": work, "path": "/work", "read_only": False}]
        busy = call_tool(client, token, "rift_vm_new", {"handle": handle, "volumes": [
            {"volume_id": data, "path": "/data", "read_only": True},
            {"volume_id": work, "path": "/work"}]})
        assert busy["isError"] is True
        assert busy["structuredContent"]["error"]["code"] == "volume_busy"
        shown = call_tool(client, token, "rift_vm_new", {"handle": handle, "volumes": [
            {"volume_id": data, "path": "/data", "read_only": True}]})["structuredContent"]
        assert shown["vm"]["volumes"] == [{"volume_id": data, "path": "/data",
                                           "read_only": True}]
        vms = client.get(f"/api/v1/tasks/{task_id}", headers=held).json()["task"]["vms"]
        assert len(vms) == 2  # the refused call left no VM
        # a snapshot lists the volumes it keeps, in one shape at each door
        snap = client.post(f"/api/v1/vms/{made.json()['vm']['id']}/snapshots", headers=held,
                           json={})
        assert snap.status_code == 201, snap.text
        kept = [{"volume_id": work, "path": "/work", "read_only": False, "size_gib": 1,
                 "forks_attach": False}]
        assert snap.json()["snapshot"]["volumes"] == kept
        seen = call_tool(client, token, "rift_task_get", {"task_id": task_id})
        assert [s["volumes"] for s in seen["structuredContent"]["task"]["snapshots"]] == [kept]
