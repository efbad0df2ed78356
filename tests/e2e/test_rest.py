"""REST /api/v1 against a real `rift serve`: the same engine calls as MCP."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers import Server


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30,
                      headers={"Authorization": f"Bearer {server.token}"}) as client:
        yield client


def refusal(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["hint"], error
    return dict(error)


def test_a_task_is_opened_held_read_released_and_closed(api: httpx.Client) -> None:
    made = api.post("/tasks", json={"name": "rest task"})
    assert made.status_code == 201
    task, handle = made.json()["task"], made.json()["handle"]
    assert task["holder"] == "api:admin" and handle.startswith(task["id"] + ".")
    got = api.get(f"/tasks/{task['id']}", headers={"Rift-Handle": handle}).json()["task"]
    assert got["id"] == task["id"] and got["status"] == "open"
    vm = api.post(f"/tasks/{task['id']}/vms", headers={"Rift-Handle": handle},
                  json={"memory_mib": 128}).json()["vm"]
    assert vm["status"] == "running" and vm["memory_mib"] == 128
    assert api.get(f"/vms/{vm['id']}").json()["vm"]["id"] == vm["id"]
    released = api.post(f"/tasks/{task['id']}/release", headers={"Rift-Handle": handle})
    assert released.json()["task"]["holder"] is None
    refusal(api.post(f"/tasks/{task['id']}/release", headers={"Rift-Handle": handle}), 409,
            "task_released")
    attached = api.post(f"/tasks/{task['id']}/attach").json()
    assert attached["previous_holder"] is None and attached["task"]["vms"][0]["id"] == vm["id"]
    closed = api.post(f"/tasks/{task['id']}/close",
                      headers={"Rift-Handle": attached["handle"]}).json()
    assert closed["destroyed"] == [vm["id"]] and closed["task"]["close_reason"] == "closed"
    events = api.get(f"/tasks/{task['id']}/events").json()
    assert [e["type"] for e in events["events"]] == [
        "opened", "vm_creating", "vm_running", "released", "attached", "closed",
        "vm_destroyed"]
    listed = api.get("/tasks", params={"status": "closed"}).json()
    assert task["id"] in [t["id"] for t in listed["tasks"]]


def test_refusals_carry_their_code_status_and_hint(server: Server, api: httpx.Client) -> None:
    made = api.post("/tasks", json={}).json()
    task_id, handle = made["task"]["id"], made["handle"]
    refusal(api.post(f"/tasks/{task_id}/vms"), 400, "handle_required")
    refusal(api.post(f"/tasks/{task_id}/vms", headers={"Rift-Handle": "nope"}), 400,
            "handle_invalid")
    refusal(api.get("/tasks/task_aaaaaaaa"), 404, "task_not_found")
    refusal(api.post(f"/tasks/{task_id}/attach"), 409, "task_held")
    other = api.post(f"/tasks/{task_id}/attach", json={"takeover": True}).json()
    assert other["previous_holder"] == "api:admin"
    error = refusal(api.get(f"/tasks/{task_id}", headers={"Rift-Handle": handle}), 409,
                    "lease_stale")
    assert "rift_task_attach" in str(error["hint"])
    refusal(api.post(f"/tasks/{task_id}/vms", headers={"Rift-Handle": other["handle"]},
                     json={"image": "windows"}), 404, "image_not_found")
    refusal(api.post(f"/tasks/{task_id}/vms", headers={"Rift-Handle": other["handle"]},
                     json={"vcpus": 65}), 422, "invalid_argument")
    for disk in (0, 1025):
        error = refusal(api.post(f"/tasks/{task_id}/vms", headers={"Rift-Handle": other["handle"]},
                                 json={"disk_gib": disk}), 422, "invalid_argument")
        assert error["field"] == "disk_gib"
    # fill the test host (64 CPUs x RIFT_CPU_OVERCOMMIT) with 64-vCPU VMs of the
    # default image (debian: 512 MiB each)
    filled = []
    for _ in range(8):
        made = api.post(f"/tasks/{task_id}/vms", headers={"Rift-Handle": other["handle"]},
                        json={"vcpus": 64})
        if made.status_code != 201:
            break
        filled.append(made.json()["vm"]["id"])
    error = refusal(made, 503, "no_capacity")
    assert error["largest_free"] == {"vcpus": 0, "memory_mib": 262144 - 512 * len(filled)}
    for vm_id in filled:
        api.delete(f"/vms/{vm_id}", headers={"Rift-Handle": other["handle"]})
    refusal(api.post(f"/tasks/{task_id}/vms", headers={"Rift-Handle": other["handle"]},
                     json={"surprise": 1}), 422, "invalid_argument")
    vm = api.post(f"/tasks/{task_id}/vms", headers={"Rift-Handle": other["handle"]}).json()["vm"]
    error = refusal(api.post(f"/vms/{vm['id']}/exec", headers={"Rift-Handle": other["handle"]},
                             json={"command": "uname -a"}), 503, "guest_unreachable")
    assert "test driver" in str(error["message"])
    refusal(api.get("/vms/vm_aaaaaaaa"), 404, "vm_not_found")
    api.post("/tasks", json={"name": "a", "idempotency_key": "k-rest"})
    refusal(api.post("/tasks", json={"name": "b", "idempotency_key": "k-rest"}), 409,
            "idempotency_conflict")
    api.post(f"/tasks/{task_id}/close", headers={"Rift-Handle": other["handle"]})
    refusal(api.post(f"/tasks/{task_id}/close", json={"takeover": True}), 409, "task_closed")
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30, headers={
            "Authorization": f"Bearer {server.new_token('mallory', 'laptop')}"}) as stranger:
        refusal(stranger.get(f"/tasks/{task_id}"), 404, "task_not_found")
        refusal(stranger.get(f"/vms/{vm['id']}"), 404, "vm_not_found")


def test_no_token_or_a_revoked_one_gets_401_and_touches_nothing(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as bare:
        _unauthorized(server, bare)


def _unauthorized(server: Server, bare: httpx.Client) -> None:
    for headers in ({}, {"Authorization": "Bearer rift_nope"}, {"Authorization": "Basic x"}):
        response = bare.get("/api/v1/tasks", headers=headers)
        refusal(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    token = server.new_token("admin", "short-lived")
    listed = server.rift("token", "list", "admin", "--json").stdout
    import json

    token_id = next(t["id"] for t in json.loads(listed) if t["label"] == "short-lived")
    auth = {"Authorization": f"Bearer {token}"}
    assert bare.get("/api/v1/tasks", headers=auth).status_code == 200
    assert server.rift("token", "revoke", token_id).returncode == 0
    refusal(bare.post("/api/v1/tasks", headers=auth, json={}), 401, "unauthorized")
    assert bare.get("/healthz").json() == {"status": "ok"}


def test_metrics_count_calls_by_tool_and_outcome(server: Server, api: httpx.Client) -> None:
    api.get("/tasks/task_aaaaaaaa")
    made = api.post("/tasks", json={}).json()
    api.post(f"/tasks/{made['task']['id']}/vms", headers={"Rift-Handle": made["handle"]})
    text = httpx.get(server.url + "/metrics", timeout=10,
                     headers={"Authorization": f"Bearer {server.token}"}).text
    assert 'rift_tool_calls_total{door="rest",outcome="task_not_found",tool="rift_task_get"}' \
        in text
    assert 'outcome="ok",tool="rift_task_new"' in text
    assert "rift_open_tasks " in text and "rift_running_vms " in text
    # Seconds from rift_vm_new to running, by start kind (every kind listed from the start).
    booted = re.search(r'^rift_vm_start_seconds_count\{kind="boot"\} (\S+)$', text, re.M)
    assert booted is not None and float(booted.group(1)) >= 1, text
    assert 'rift_vm_start_seconds_count{kind="pool"} 0.0' in text
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401


def test_openapi_lists_every_route(server: Server) -> None:
    paths = httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]
    assert set(paths) >= {
        "/api/v1/tasks", "/api/v1/tasks/{task_id}", "/api/v1/tasks/{task_id}/attach",
        "/api/v1/tasks/{task_id}/release", "/api/v1/tasks/{task_id}/close",
        "/api/v1/tasks/{task_id}/events", "/api/v1/tasks/{task_id}/vms", "/api/v1/vms/{vm_id}",
        "/api/v1/vms/{vm_id}/exec", "/api/v1/vms/{vm_id}/files"}
    assert set(paths["/api/v1/vms/{vm_id}"]) == {"get", "delete"}
    assert set(paths["/api/v1/vms/{vm_id}/files"]) == {"get", "put"}


def test_unknown_routes_answer_a_plain_404(server: Server) -> None:
    response = httpx.get(server.url + "/api/v1/nothing-here", timeout=10,
                         headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    # without a token the door says so first: nothing about what routes there are
    assert httpx.get(server.url + "/api/v1/nothing-here", timeout=10).status_code == 401


def test_logs_are_json_lines_without_tokens_or_handle_secrets(server: Server,
                                                             api: httpx.Client) -> None:
    import json

    made = api.post("/tasks", json={"name": "log check"}).json()
    handle = made["handle"]
    taken = api.post(f"/tasks/{made['task']['id']}/attach", json={"takeover": True}).json()
    api.get(f"/tasks/{made['task']['id']}", headers={"Rift-Handle": handle})  # stale
    api.post(f"/tasks/{made['task']['id']}/release", headers={"Rift-Handle": taken["handle"]})
    lines = [json.loads(line) for line in server.log.read_text().splitlines()
             if line.startswith("{")]
    assert any(line.get("msg") == "request" and line.get("status") == 409 for line in lines)
    text = server.log.read_text()
    for secret in (server.token, handle.split(".")[1], taken["handle"].split(".")[1]):
        assert secret not in text
    for stored in server.data_dir.rglob("*"):  # rift.db, its WAL and anything else
        if stored.is_file():
            blob = stored.read_bytes()
            assert handle.split(".")[1].encode() not in blob and server.token.encode() not in blob
