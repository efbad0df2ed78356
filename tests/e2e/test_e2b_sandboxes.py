"""The E2B door's sandboxes as E2B answers them (SPEC §16), on a real `rift serve`
over libvirt's test driver, driven by E2B's own SDK: lists filtered by state,
metadata, template and start, newest first (or oldest), paged by `limit` and
`nextToken`; a sandbox's end read back, moved by `set_timeout` and only
lengthened by `connect`; `secure` answers both tokens, and a connect by the same
holder answers the same ones; a metrics range before the sandbox answers none."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState

from tests.support.e2b import Door
from tests.support.e2b import door as served

DOMAIN = "e2b.test"


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    with served(tmp_path_factory.mktemp("e2b-sandboxes"), RIFT_PREVIEW_DOMAIN=DOMAIN) as made:
        yield made


def _ids(found: list[Any]) -> list[str]:
    return [s.sandbox_id for s in found]


def test_lists_are_filtered_ordered_and_paged_as_e2b_answers(door: Door) -> None:
    made = [Sandbox.create(metadata={"suite": "list", "n": str(i)}, timeout=300,
                           **door.opts) for i in range(3)]
    first, middle, last = (s.sandbox_id for s in made)
    try:
        assert made[1].pause()
        mine = {"suite": "list"}
        paginator = Sandbox.list(query=SandboxQuery(metadata=mine), limit=2, **door.opts)
        assert _ids(paginator.next_items()) == [last, middle]  # newest first
        assert paginator.has_next and paginator.next_token is not None
        assert _ids(paginator.next_items()) == [first]
        assert not paginator.has_next and paginator.next_token is None
        asc = Sandbox.list(query=SandboxQuery(metadata=mine), order="asc", **door.opts)
        assert _ids(asc.next_items()) == [first, middle, last]
        paused = Sandbox.list(query=SandboxQuery(metadata=mine, state=[SandboxState.PAUSED]),
                              **door.opts).next_items()
        assert [(s.sandbox_id, s.state) for s in paused] == [(middle, SandboxState.PAUSED)]
        running = Sandbox.list(query=SandboxQuery(metadata=mine, state=[SandboxState.RUNNING]),
                               limit=1, **door.opts)
        assert _ids(running.next_items()) == [last]
        assert _ids(running.next_items()) == [first] and not running.has_next
        assert _ids(Sandbox.list(query=SandboxQuery(metadata={"n": "2"}),
                                 **door.opts).next_items()) == [last]
        assert Sandbox.list(query=SandboxQuery(metadata=mine, template="nope"),
                            **door.opts).next_items() == []
        assert len(Sandbox.list(query=SandboxQuery(metadata=mine, template="base"),
                                **door.opts).next_items()) == 3
        started = made[2].get_info().started_at
        assert _ids(Sandbox.list(query=SandboxQuery(metadata=mine, started_after=started),
                                 **door.opts).next_items()) == [last]
        later = started + datetime.timedelta(seconds=1)
        assert Sandbox.list(query=SandboxQuery(metadata=mine, started_after=later),
                            **door.opts).next_items() == []
    finally:
        for sbx in made:
            sbx.kill()
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": "list"}),
                        **door.opts).next_items() == []


def test_an_end_is_read_back_moved_and_only_lengthened_by_connect(door: Door) -> None:
    sbx = Sandbox.create(timeout=300, **door.opts)
    try:
        info = sbx.get_info()
        assert 299 <= (info.end_at - info.started_at).total_seconds() <= 301
        listed = Sandbox.list(**door.opts).next_items()
        assert [s.end_at for s in listed if s.sandbox_id == sbx.sandbox_id] == [info.end_at]
        Sandbox.connect(sbx.sandbox_id, timeout=10, **door.opts)
        assert sbx.get_info().end_at == info.end_at
        Sandbox.connect(sbx.sandbox_id, timeout=900, **door.opts)
        longer = sbx.get_info().end_at
        assert longer > info.end_at
        sbx.set_timeout(60)  # set_timeout may shorten it
        assert sbx.get_info().end_at < longer
        assert sbx.is_running()
        sbx.set_timeout(1)
        time.sleep(1.1)
        assert not sbx.is_running()  # over at its end, whether or not the kill is done
    finally:
        Sandbox.kill(sbx.sandbox_id, **door.opts)


def test_a_secured_sandbox_answers_both_tokens_and_its_holder_gets_them_again(
        door: Door) -> None:
    sbx = Sandbox.create(secure=True, timeout=60, **door.opts)
    try:
        assert sbx._envd_access_token and sbx.traffic_access_token
        again = Sandbox.connect(sbx.sandbox_id, **door.opts)
        assert (again._envd_access_token, again.traffic_access_token) == \
            (sbx._envd_access_token, sbx.traffic_access_token)
        now = datetime.datetime.now(datetime.UTC)
        assert sbx.get_metrics(start=now - datetime.timedelta(hours=1),
                               end=now - datetime.timedelta(minutes=30)) == []
    finally:
        sbx.kill()


def _port(door: Door, host: str, token: str | None = None) -> httpx.Response:
    headers = {"Host": host, **({"e2b-traffic-access-token": token} if token else {})}
    return httpx.get(door.srv.url + "/", headers=headers, timeout=30)


def test_a_port_host_name_needs_the_sandboxs_traffic_token(door: Door) -> None:
    sbx = Sandbox.create(timeout=60, **door.opts)
    try:
        host = sbx.get_host(8001)
        assert host == f"8001-{sbx.sandbox_id}.{DOMAIN}"
        assert _port(door, host).status_code == 403  # public ports are the operator's call
        assert _port(door, host, "rift_traffic_wrong").status_code == 403
        assert _port(door, f"8001-zzzzzzzz.{DOMAIN}", sbx.traffic_access_token).status_code \
            == 404
        # the token lets it through to the relay: the test driver has no guest to answer
        reached = _port(door, host, sbx.traffic_access_token)
        assert reached.status_code == 502 and "guest" in reached.text
    finally:
        sbx.kill()
    assert _port(door, host, sbx.traffic_access_token).status_code == 404


def _auto_paused(door: Door, auto_resume: bool) -> dict[str, Any]:
    """A sandbox made with `autoPause` and a 1 s timeout, once its VM sleeps."""
    made = httpx.post(door.srv.url + "/e2b/v2/sandboxes", headers={"X-API-Key": door.srv.token},
                      json={"templateID": "base", "timeout": 1, "autoPause": True,
                            "autoResume": {"enabled": auto_resume}}, timeout=60)
    assert made.status_code == 201, made.text
    deadline = time.monotonic() + 30  # the sweep looks each second
    while door.vm(made.json()["sandboxID"])["status"] != "sleeping":
        assert time.monotonic() < deadline, "not asleep after its end"
        time.sleep(0.5)
    return made.json()  # type: ignore[no-any-return]


def _detail(door: Door, sandbox: str) -> dict[str, Any]:
    got = httpx.get(f"{door.srv.url}/e2b/sandboxes/{sandbox}", timeout=30,
                    headers={"X-API-Key": door.srv.token})
    assert got.status_code == 200, got.text
    return got.json()  # type: ignore[no-any-return]


def _health(door: Door, made: dict[str, Any]) -> int:
    return httpx.get(door.srv.url + "/e2b/health", timeout=30, headers={
        "E2b-Sandbox-Id": made["sandboxID"],
        "X-Access-Token": made["envdAccessToken"]}).status_code


def test_an_auto_paused_sandbox_without_auto_resume_sleeps_at_its_end_until_connect(
        door: Door) -> None:
    """`autoPause`: at its end the sandbox is not killed but its VM sleeps (SPEC §17),
    E2B's `paused`: without `autoResume` its traffic is refused 502 (is_running False,
    no wake) until `connect` wakes it and gives it an end again."""
    made = _auto_paused(door, auto_resume=False)
    sandbox = made["sandboxID"]
    try:
        detail = _detail(door, sandbox)
        assert detail["state"] == "paused"
        assert detail["lifecycle"] == {"onTimeout": "pause", "autoResume": False}
        listed = httpx.get(door.srv.url + "/e2b/v2/sandboxes?state=paused", timeout=30,
                           headers={"X-API-Key": door.srv.token}).json()
        assert sandbox in [s["sandboxID"] for s in listed]
        assert _health(door, made) == 502
        read = httpx.get(door.srv.url + "/e2b/files?path=/etc/hostname", timeout=30, headers={
            "E2b-Sandbox-Id": sandbox, "X-Access-Token": made["envdAccessToken"]})
        assert read.status_code == 502 and "Sandbox.connect" in read.text
        assert door.vm(sandbox)["status"] == "sleeping"  # nothing woke it
        resumed = httpx.post(f"{door.srv.url}/e2b/sandboxes/{sandbox}/connect", timeout=60,
                             headers={"X-API-Key": door.srv.token}, json={})
        assert resumed.status_code == 201, resumed.text
        assert door.vm(sandbox)["status"] == "running"
        detail = _detail(door, sandbox)
        assert detail["state"] == "running" and detail["endAt"] > detail["startedAt"]
    finally:
        Sandbox.kill(sandbox, **door.opts)


def test_an_auto_paused_sandbox_with_auto_resume_is_woken_by_its_traffic(door: Door) -> None:
    """With `autoResume`, a data-plane call reaches the sandbox paused at its end: its
    end starts again (E2B's default timeout) and the call wakes its VM."""
    made = _auto_paused(door, auto_resume=True)
    sandbox = made["sandboxID"]
    try:
        assert _detail(door, sandbox)["state"] == "paused"
        assert _health(door, made) == 204  # its traffic is let in
        detail = _detail(door, sandbox)
        assert detail["state"] == "running" and detail["endAt"] > detail["startedAt"]
        read = httpx.get(door.srv.url + "/e2b/files?path=/etc/hostname", timeout=60, headers={
            "E2b-Sandbox-Id": sandbox, "X-Access-Token": made["envdAccessToken"]})
        assert read.status_code != 502, read.text  # no guest on the test driver: not 200
        assert door.vm(sandbox)["status"] == "running"  # the call woke it
    finally:
        Sandbox.kill(sandbox, **door.opts)


def test_a_sandboxs_logs_are_its_tasks_events_through_e2bs_own_api_client(
        door: Door) -> None:
    """E2B's generated API client (the SDK's, as its CLI's `sandbox logs` calls it):
    v1 from `start` on, v2 forward or backward from a cursor, by level and search;
    another user's sandbox the same 404 as an unknown one; a bad query a 400."""
    from e2b.api.client.api.sandboxes import (
        get_sandboxes_sandbox_id_logs as v1,
    )
    from e2b.api.client.api.sandboxes import (
        get_v_2_sandboxes_sandbox_id_logs as v2,
    )
    from e2b.api.client.models import LogLevel, LogsDirection
    from e2b.connection_config import ConnectionConfig
    from e2b.sandbox_sync.paginator import get_api_client

    client = get_api_client(ConnectionConfig(**door.opts))
    sbx = Sandbox.create(timeout=60, **door.opts)
    try:
        sbx.pause()  # an event after the sandbox's start
        old = v1.sync(sbx.sandbox_id, client=client)
        new = v2.sync(sbx.sandbox_id, client=client)
        assert old is not None and new is not None
        types = [entry.fields["type"] for entry in old.log_entries]
        assert types[0] == "opened" and "vm_running" in types and types[-1] == "vm_paused", types
        assert [line.line for line in old.logs] == [e.message for e in old.log_entries]
        assert all(e.level == LogLevel.INFO for e in old.log_entries)
        assert [e.message for e in new.logs] == [e.message for e in old.log_entries]
        last = old.log_entries[-1].timestamp
        later = int(last.timestamp() * 1000) + 1
        assert v1.sync(sbx.sandbox_id, client=client, start=later).log_entries == []
        back = v2.sync(sbx.sandbox_id, client=client, direction=LogsDirection.BACKWARD,
                       limit=2)
        assert back is not None and [e.message for e in back.logs] == [
            e.message for e in reversed(old.log_entries)][:2]
        found = v2.sync(sbx.sandbox_id, client=client, search="vm_paused")
        assert found is not None and [e.fields["type"] for e in found.logs] == ["vm_paused"]
        errors = v2.sync(sbx.sandbox_id, client=client, level=LogLevel.ERROR)
        assert errors is not None and errors.logs == []
        other = get_api_client(ConnectionConfig(**{**door.opts, "api_key": door.srv.new_token(
            "eve", "eve's logs")}))
        for sandbox in (sbx.sandbox_id, "zzzzzzzz"):
            assert v1.sync_detailed(sandbox, client=other).status_code == 404
            assert v2.sync_detailed(sandbox, client=other).status_code == 404
        assert v2.sync_detailed(sbx.sandbox_id, client=client, limit=5000).status_code == 400
    finally:
        Sandbox.kill(sbx.sandbox_id, **door.opts)


def _content_api(door: Door, vol: Any) -> None:
    """A detached volume's files through E2B's volume content API, no sandbox."""
    from e2b.exceptions import VolumeException, VolumePathNotFoundException
    from e2b.volume.types import VolumeFileType

    o = door.opts
    assert vol.token == o["api_key"]  # the bearer is the caller's own key
    made = vol.make_dir("/src/deep", force=True, mode=0o750, **o)
    assert (made.type, made.mode) == (VolumeFileType.DIRECTORY, 0o750)
    wrote = vol.write_file("/src/note.txt", "kept without a sandbox", mode=0o600, uid=1000,
                           **o)
    assert (wrote.type, wrote.size, wrote.mode, wrote.uid) == (VolumeFileType.FILE, 22,
                                                               0o600, 1000)
    assert vol.read_file("/src/note.txt", **o) == "kept without a sandbox"
    assert vol.read_file("/src/note.txt", format="bytes", **o) == b"kept without a sandbox"
    assert sorted((e.path, e.type) for e in vol.list("/src", depth=2, **o)) == [
        ("/src/deep", VolumeFileType.DIRECTORY), ("/src/note.txt", VolumeFileType.FILE)]
    assert vol.exists("/src/deep", **o) and not vol.exists("/nope", **o)
    assert vol.get_info("/src/note.txt", **o).mtime.year >= 2024
    assert vol.update_metadata("/src/deep", mode=0o700, gid=5, **o).gid == 5
    with pytest.raises(VolumeException, match=r"409|there already"):
        vol.write_file("/src/note.txt", "again", **o)  # only with force
    assert vol.write_file("/src/note.txt", "again, forced", force=True, **o).size == 13
    with pytest.raises(VolumePathNotFoundException):
        vol.read_file("/nope", **o)
    with pytest.raises(VolumePathNotFoundException):
        vol.write_file("/no/such/folder/x", "x", **o)
    vol.remove("/src/deep", **o)
    assert not vol.exists("/src/deep", **o) and vol.exists("/src/note.txt", **o)


def test_volumes_through_e2bs_own_volume_api_and_volume_mounts(door: Door) -> None:
    """E2B's `Volume` (create, list, get, connect, destroy) are Rift's volumes of the
    key's user; `volume_mounts` on create attach them to the sandbox's VM (by name),
    its detail answers them; a delete while attached is 409 naming the VM; the
    sandbox's kill detaches, never deletes; another user's volume is an unknown one.
    E2B's volume content API reads and writes the detached volume's files (its real
    ext4, on the test driver's host) and refuses an attached one (409, volume_busy)."""
    from e2b import Volume
    from e2b.exceptions import (
        NotFoundException,
        SandboxException,
        VolumeException,
        VolumePathNotFoundException,
    )

    vol = Volume.create("e2b-data", **door.opts)
    assert vol.volume_id.startswith("vol_") and vol.name == "e2b-data"
    rift_view = door.rest(f"volumes/{vol.volume_id}")["volume"]
    assert (rift_view["name"], rift_view["size_gib"]) == ("e2b-data", 10)
    listed = Volume.list(**door.opts)
    assert [(v.volume_id, v.name) for v in listed if v.name == "e2b-data"] == \
        [(vol.volume_id, "e2b-data")]
    assert Volume.connect(vol.volume_id, **door.opts).name == "e2b-data"
    with pytest.raises(VolumeException):
        Volume.create("e2b-data", **door.opts)  # names are unique per user: 400
    with pytest.raises(SandboxException, match="volume_not_found"):  # 404
        Sandbox.create(volume_mounts={"/data": "no-such-volume"}, timeout=60, **door.opts)
    _content_api(door, vol)
    sbx = Sandbox.create(volume_mounts={"/data": vol}, timeout=60, **door.opts)
    try:
        with pytest.raises(VolumeException, match="volume_busy") as held:
            vol.read_file("/src/note.txt", **door.opts)  # its VM's while attached
        assert f"vm_{sbx.sandbox_id}" in str(held.value) and "rift_vm_detach_volume" in \
            str(held.value)
        assert sbx.get_info().volume_mounts == [{"name": "e2b-data", "path": "/data"}]
        listed_sbx = Sandbox.list(**door.opts).next_items()
        assert [s.volume_mounts for s in listed_sbx if s.sandbox_id == sbx.sandbox_id] == \
            [[{"name": "e2b-data", "path": "/data"}]]
        assert door.vm(sbx)["volumes"] == [
            {"volume_id": vol.volume_id, "path": "/data", "read_only": False}]
        with pytest.raises(VolumeException) as busy:
            Volume.destroy(vol.volume_id, **door.opts)
        assert "volume_busy" in str(busy.value) and f"vm_{sbx.sandbox_id}" in str(busy.value)
    finally:
        sbx.kill()
    assert door.rest(f"volumes/{vol.volume_id}")["volume"]["attached_to"] == []
    other = {**door.opts, "api_key": door.srv.new_token("mallory", "mallory's volumes")}
    with pytest.raises(NotFoundException):
        Volume.get_info(vol.volume_id, **other)
    assert Volume.destroy(vol.volume_id, **other) is False  # 404: not hers
    with pytest.raises(VolumePathNotFoundException):  # hers: none of this user's
        Volume.connect(vol.volume_id, **door.opts).read_file(
            "/src/note.txt", **{**door.opts, "token": other["api_key"]})
    assert vol.read_file("/src/note.txt", **door.opts) == "again, forced"  # kept, detached
    assert Volume.destroy(vol.volume_id, **door.opts) is True
    assert Volume.destroy(vol.volume_id, **door.opts) is False
    assert Volume.destroy("not-a-volume", **door.opts) is False
