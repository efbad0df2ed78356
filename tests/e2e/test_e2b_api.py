"""The E2B door's control plane and its refusals (SPEC §16), on a real `rift serve`
over libvirt's test driver (VMs with no guest behind them): E2B's own SDK creates,
reads, lists (paged, by state and metadata), times and kills sandboxes; a bad key
is the SDK's AuthenticationException, another user's sandbox the same 404 as an
unknown one; envd's data plane refuses a missing or stale access token (naming the
holder) and a malformed Connect message with a Connect error."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import AuthenticationException, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, SandboxException

from tests.support.e2b import Door, e2b_opts
from tests.support.e2b import door as served


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    with served(tmp_path_factory.mktemp("e2b-api")) as made:
        yield made


def _api(door: Door, method: str, path: str, key: str | None = None,
         **kwargs: Any) -> httpx.Response:
    headers = {"X-API-Key": key if key is not None else door.srv.token,
               **kwargs.pop("headers", {})}
    return httpx.request(method, f"{door.srv.url}/e2b{path}", headers=headers, timeout=30,
                         **kwargs)


def _envd(door: Door, path: str, sandbox: str, token: str | None, body: bytes,
          content_type: str = "application/connect+json") -> httpx.Response:
    headers = {"E2b-Sandbox-Id": sandbox, "Content-Type": content_type,
               "Connect-Protocol-Version": "1"}
    if token is not None:
        headers["X-Access-Token"] = token
    return httpx.post(f"{door.srv.url}/e2b{path}", headers=headers, content=body, timeout=30)


def _end_error(answer: httpx.Response) -> dict[str, Any]:
    """The error of a Connect stream's end (its last envelope, flag 2)."""
    data = answer.content
    last: dict[str, Any] = {}
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        last = json.loads(data[5:5 + size]) if flags & 2 else last
        data = data[5 + size:]
    error: dict[str, Any] = last["error"]
    return error


def test_sandboxes_are_made_read_listed_timed_and_killed(door: Door) -> None:
    made = [Sandbox.create(metadata={"n": str(i), "suite": "api"}, timeout=120, **door.opts)
            for i in range(3)]
    info = Sandbox.get_info(made[0].sandbox_id, **door.opts)
    assert (info.state, info.metadata, info.template_id, info.envd_version) == \
        (SandboxState.RUNNING, {"n": "0", "suite": "api"}, "base", "0.6.4")
    assert 119 <= (info.end_at - info.started_at).total_seconds() <= 121
    made[0].set_timeout(600)
    moved = made[0].get_info()
    assert moved.end_at > info.end_at

    pages = Sandbox.list(query=SandboxQuery(metadata={"suite": "api"}), limit=2, **door.opts)
    first = pages.next_items()
    assert len(first) == 2 and pages.has_next
    second = pages.next_items()
    assert not pages.has_next
    assert sorted(s.sandbox_id for s in first + second) == sorted(s.sandbox_id for s in made)
    only = Sandbox.list(query=SandboxQuery(metadata={"n": "1"}), **door.opts).next_items()
    assert [s.sandbox_id for s in only] == [made[1].sandbox_id]
    paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]), **door.opts)
    assert paused.next_items() == []

    for sbx in made:
        assert sbx.kill()
    assert not Sandbox.kill(made[0].sandbox_id, **door.opts)  # a second kill: not found
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": "api"}),
                        **door.opts).next_items() == []


def test_a_sandbox_is_killed_at_its_timeout_unless_it_is_moved(door: Door) -> None:
    short = Sandbox.create(timeout=1, **door.opts)
    kept = Sandbox.create(timeout=5, **door.opts)
    kept.set_timeout(300)
    task_id = short._envd_access_token.partition(".")[0]  # type: ignore[union-attr]
    deadline = time.monotonic() + 15
    while short.is_running():
        assert time.monotonic() < deadline, "the sandbox outlived its timeout"
        time.sleep(0.2)
    with pytest.raises(NotFoundException):
        short.get_info()
    auth = {"Authorization": f"Bearer {door.srv.token}"}
    while httpx.get(f"{door.srv.url}/api/v1/tasks/{task_id}", headers=auth,  # the sweep's kill
                    timeout=30).json()["task"]["status"] != "closed":
        assert time.monotonic() < deadline, "the sandbox's task outlived its timeout"
        time.sleep(0.2)
    events = httpx.get(f"{door.srv.url}/api/v1/tasks/{task_id}/events", headers=auth,
                       timeout=30).json()["events"]
    assert any(e["actor"] == "e2b:timeout" for e in events), events
    assert kept.get_info().state == SandboxState.RUNNING
    kept.kill()


def test_a_sandbox_is_a_task_of_its_own_held_by_e2b(door: Door) -> None:
    sbx = Sandbox.create(**door.opts)
    try:
        auth = {"Authorization": f"Bearer {door.srv.token}"}
        vm = httpx.get(f"{door.srv.url}/api/v1/vms/vm_{sbx.sandbox_id}", headers=auth,
                       timeout=30).json()["vm"]
        task = httpx.get(f"{door.srv.url}/api/v1/tasks/{vm['task_id']}", headers=auth,
                         timeout=30).json()["task"]
        assert task["name"] == "e2b base" and task["holder"].startswith("e2b:")
        assert sbx._envd_access_token and sbx._envd_access_token.startswith(task["id"] + ".")
    finally:
        sbx.kill()


def test_connects_share_the_lease_and_another_holders_connect_takes_it_over(door: Door) -> None:
    sbx = Sandbox.create(**door.opts)
    try:
        same = Sandbox.connect(sbx.sandbox_id, **door.opts)
        assert same._envd_access_token == sbx._envd_access_token  # one lease, shared
        other = Sandbox.connect(sbx.sandbox_id, **e2b_opts(
            door.srv.url, door.srv.new_token("admin", "second-script")))
        assert other._envd_access_token != sbx._envd_access_token
        with pytest.raises(SandboxException) as refused:
            sbx.files.read("/etc/hostname")
        assert "e2b:second-script" in str(refused.value)
        back = Sandbox.connect(sbx.sandbox_id, **door.opts)  # and back: a takeover again
        assert back._envd_access_token not in (sbx._envd_access_token,
                                               other._envd_access_token)
    finally:
        sbx.kill()


def test_a_paused_sandbox_is_listed_paused_and_connect_resumes_it(door: Door) -> None:
    sbx = Sandbox.create(**door.opts)
    try:
        assert sbx.pause()
        assert sbx.get_info().state == SandboxState.PAUSED
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]),
                              **door.opts).next_items()
        assert [s.sandbox_id for s in paused] == [sbx.sandbox_id]
        assert not sbx.pause()  # paused already: 409, the SDK's False
        resumed = _api(door, "POST", f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={})
        assert resumed.status_code == 201, resumed.text
        assert resumed.json()["envdAccessToken"] == sbx._envd_access_token
        assert sbx.get_info().state == SandboxState.RUNNING
        ran = _api(door, "POST", f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={})
        assert ran.status_code == 200
    finally:
        sbx.kill()


def test_a_bad_key_is_refused_401_and_another_users_sandbox_is_unknown(door: Door) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(**{**door.opts, "api_key": "rift_" + "x" * 43})
    assert _api(door, "GET", "/v2/sandboxes", key="").status_code == 401
    refused = _api(door, "GET", "/v2/sandboxes", key="nonsense")
    assert refused.status_code == 401 and refused.json()["code"] == 401
    sbx = Sandbox.create(**door.opts)
    try:
        eve = door.srv.new_token("eve", "eve-e2b")
        theirs = _api(door, "GET", f"/sandboxes/{sbx.sandbox_id}", key=eve)
        unknown = _api(door, "GET", "/sandboxes/zzzzzzzz", key=eve)
        assert theirs.status_code == unknown.status_code == 404
        assert set(theirs.json()) == set(unknown.json()) == {"code", "message"}
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sbx.sandbox_id, **e2b_opts(door.srv.url, eve))
        assert _api(door, "DELETE", f"/sandboxes/{sbx.sandbox_id}", key=eve).status_code == 404
        assert sbx.is_running()  # still there for its owner
    finally:
        sbx.kill()


def test_bad_input_is_answered_in_e2b_shape(door: Door) -> None:
    no_image = _api(door, "POST", "/v2/sandboxes", json={"templateID": "no-such-image"})
    assert no_image.status_code == 404 and "no-such-image" in no_image.json()["message"]
    for body in ({"templateID": "base", "timeout": -1}, {"templateID": 7},
                 {"templateID": "base", "envVars": {"A B": "c"}}):
        answer = _api(door, "POST", "/v2/sandboxes", json=body)
        assert answer.status_code == 400 and answer.json()["code"] == 400, (body, answer.text)
    assert _api(door, "POST", "/v2/sandboxes", content=b"{not json").status_code == 400
    unnamed = _api(door, "POST", "/v3/templates", json={})  # a template build names its image
    assert unnamed.status_code == 400 and "invalid_argument" in unnamed.json()["message"]
    assert _api(door, "POST", "/v3/templates", key="").status_code == 401
    unserved = _api(door, "GET", "/templates/base/tags")  # template tags
    assert unserved.status_code == 501 and "not served" in unserved.json()["message"]


def test_envd_refuses_missing_stale_and_malformed_calls(door: Door) -> None:
    sbx = Sandbox.create(**door.opts)
    token = sbx._envd_access_token
    assert isinstance(token, str)
    start = b'{"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]}}'
    framed = struct.pack(">BI", 0, len(start)) + start
    try:
        missing = _envd(door, "/process.Process/Start", sbx.sandbox_id, None, framed)
        assert missing.status_code == 200 and _end_error(missing)["code"] == "unauthenticated"
        for body, ctype, code in (
                (b"\x00\x00", "application/connect+json", "invalid_argument"),
                (struct.pack(">BI", 0, 3) + b"{no", "application/connect+json",
                 "invalid_argument"),
                (struct.pack(">BI", 0, 99) + start, "application/connect+json",
                 "invalid_argument"),
                (framed, "application/connect+proto", "unimplemented")):
            answer = _envd(door, "/process.Process/Start", sbx.sandbox_id, token, body, ctype)
            assert answer.status_code == 200 and _end_error(answer)["code"] == code, body
        other_rpc = _envd(door, "/filesystem.Filesystem/NoSuchCall", sbx.sandbox_id, token,
                          b"{}", "application/json")
        assert other_rpc.status_code == 501 and other_rpc.json()["code"] == "unimplemented"
        no_path = _envd(door, "/filesystem.Filesystem/CreateWatcher", sbx.sandbox_id, token,
                        b"{}", "application/json")
        assert no_path.status_code == 400 and no_path.json()["code"] == "invalid_argument"

        auth = {"Authorization": f"Bearer {door.srv.token}"}
        task_id = token.partition(".")[0]
        took = httpx.post(f"{door.srv.url}/api/v1/tasks/{task_id}/attach", headers=auth,
                          json={"takeover": True}, timeout=30)
        assert took.status_code == 200, took.text
        stale = _envd(door, "/process.Process/Start", sbx.sandbox_id, token, framed)
        error = _end_error(stale)
        assert error["code"] == "permission_denied" and "api:" in error["message"]
        read = httpx.get(f"{door.srv.url}/e2b/files", params={"path": "/etc/hostname"},
                         headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": token},
                         timeout=30)
        assert read.status_code == 403 and "lease_stale" in read.json()["message"]
        with pytest.raises(SandboxException):
            sbx.files.read("/etc/hostname")
    finally:
        sbx.kill()


def test_malformed_pty_calls_are_refused_with_connect_errors(door: Door) -> None:
    sbx = Sandbox.create(**door.opts)
    token = sbx._envd_access_token
    assert isinstance(token, str)
    try:
        for pty in ('"80x24"', '{"size": [24, 80]}', '{"size": {"rows": "24", "cols": 80}}'):
            start = ('{"process": {"cmd": "/bin/bash", "args": ["-i", "-l"]}, "pty": '
                     + pty + "}").encode()
            answer = _envd(door, "/process.Process/Start", sbx.sandbox_id, token,
                           struct.pack(">BI", 0, len(start)) + start)
            assert answer.status_code == 200 and \
                _end_error(answer)["code"] == "invalid_argument", pty
        for body, status, code in (
                (b'{"process": {"pid": 12345}, "pty": {"size": {"rows": 24, "cols": 80}}}',
                 404, "not_found"),
                (b'{"pty": {"size": {"rows": 24, "cols": 80}}}', 400, "invalid_argument")):
            update = _envd(door, "/process.Process/Update", sbx.sandbox_id, token, body,
                           "application/json")
            assert (update.status_code, update.json()["code"]) == (status, code), body
    finally:
        sbx.kill()
