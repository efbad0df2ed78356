"""Hostile clients at the doors (SPEC §15) against a real `rift serve` on the test
driver: the token before the body, per-route body caps, the budget of waiting
calls, login throttling under concurrency, exec creation rate-limited."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rift.api.gate import FORM_BODY, JSON_BODY
from rift.api.guard import MAX_BODY
from tests.support.servers import Server, start_server, stop_server

MIB = 1024 * 1024
BIG = 34 * MIB


class Running:
    def __init__(self, pid: int, server: Server) -> None:
        self.pid = pid
        self.server = server

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    proc, srv = start_server(tmp_path_factory.mktemp("rift"), RIFT_MAX_WAITING_PER_USER="4",
                             RIFT_LOGIN_CONCURRENCY="2")
    try:
        yield Running(proc.pid, srv)
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def server(running: Running) -> Server:
    return running.server


def _raw_post(server: Server, path: str, body: bytes, **headers: str) -> tuple[int, bytes, int]:
    """POST with a declared body sent in full unless the answer comes first: (status,
    answer, bytes of the body sent before the answer)."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    sock.sendall((head + "\r\n").encode())
    sent = 0
    sock.setblocking(False)
    answer = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            answer += sock.recv(65536)
            if b"\r\n\r\n" in answer:
                break
        except BlockingIOError:
            pass
        if sent < len(body):
            try:
                sent += sock.send(body[sent:sent + MIB])
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                time.sleep(0.001)
        else:
            time.sleep(0.005)
    sock.setblocking(True)
    sock.settimeout(5)
    try:
        while b"\r\n\r\n" in answer and len(answer.partition(b"\r\n\r\n")[2]) < 2:
            more = sock.recv(65536)
            if not more:
                break
            answer += more
    except (TimeoutError, OSError):
        pass
    sock.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1") else 0
    return status, answer, sent


def test_a_34_mib_body_without_a_token_is_refused_401_unread(running: Running) -> None:
    server = running.server
    before = running.rss_mib()
    # 34 MiB of small numbers: read and parsed, this grew the server by about 150 MiB
    body = b'{"command": [' + b"0," * (BIG // 2 - 10) + b"0]}"
    for path in ("/api/v1/vms/vm_aaaaaaaa/exec", "/mcp", "/api/v1/tasks"):
        started = time.monotonic()
        status, answer, _ = _raw_post(server, path, body, Content_Type="application/json",
                                      Accept="application/json, text/event-stream")
        took = time.monotonic() - started
        assert status == 401, answer[:300]
        assert took < 5, took
        started = time.monotonic()
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        assert time.monotonic() - started < 1
    grown = running.rss_mib() - before
    assert grown < 64, f"the server grew {grown:.0f} MiB"


def test_the_e2b_door_checks_its_key_and_access_token_before_reading_a_body(
        running: Running) -> None:
    server = running.server
    before = running.rss_mib()
    body = b'{"templateID": "' + b"a" * (BIG - 40) + b'"}'
    cases = (("/e2b/v2/sandboxes", {}, 401),  # no X-API-Key
             ("/e2b/v2/sandboxes", {"X_API_Key": "rift_" + "x" * 40}, 401),  # a made-up key
             ("/e2b/files?path=/tmp/x", {"E2b_Sandbox_Id": "aaaaaaaa"}, 401),  # no token
             ("/e2b/process.Process/Start",  # a token of a task that is not there: a
              {"E2b_Sandbox_Id": "aaaaaaaa", "X_Access_Token": "task_aaaaaaaa." + "b" * 43},
              200))  # Connect stream's refusal, `unauthenticated` in its end message
    for path, headers, want in cases:
        started = time.monotonic()
        status, answer, sent = _raw_post(server, path, body, Content_Type="application/json",
                                         **headers)
        assert status == want, (path, answer[:300])
        assert b'"code"' in answer and time.monotonic() - started < 5
        assert want == 401 or b"unauthenticated" in answer
        assert sent < BIG, f"{path}: the whole body went in before the answer"
    grown = running.rss_mib() - before
    assert grown < 64, f"the server grew {grown:.0f} MiB"


def test_a_34_mib_body_with_a_token_on_a_json_route_is_413_at_once(running: Running) -> None:
    server = running.server
    before = running.rss_mib()
    body = b'{"name": "' + b"x" * (BIG - 20) + b'"}'
    status, answer, _ = _raw_post(server, "/api/v1/tasks", body,
                                     Authorization=f"Bearer {server.token}",
                                     Content_Type="application/json")
    assert status == 413, answer[:300]
    error = httpx.Response(413, content=answer.partition(b"\r\n\r\n")[2]).json()["error"]
    assert error["code"] == "invalid_argument" and error["limit_bytes"] == JSON_BODY
    assert "64 KiB" in error["message"] and "/files" in error["hint"], error
    assert running.rss_mib() - before < 64


def test_json_routes_take_64_kib_and_content_routes_more(server: Server) -> None:
    auth = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=30) as api:
        under = api.post("/api/v1/tasks", content=b'{"name": "' + b"x" * (JSON_BODY - 20)
                         + b'"}', headers={"Content-Type": "application/json"})
        assert under.status_code == 422 and under.json()["error"]["field"] == "name"
        over = api.post("/api/v1/tasks", content=b'{"name": "' + b"x" * JSON_BODY + b'"}',
                        headers={"Content-Type": "application/json"})
        assert over.status_code == 413, over.text[:300]
        assert over.json()["error"]["limit_bytes"] == JSON_BODY
        # 1 MiB of file content passes the guard (refused for what it says: no handle)
        put = api.put("/api/v1/vms/vm_aaaaaaaa/files", params={"path": "/tmp/f"},
                      json={"content": "x" * MIB})
        assert put.status_code != 413 and put.json()["error"]["code"] in (
            "handle_required", "vm_not_found"), put.text[:300]
        ran = api.post("/api/v1/vms/vm_aaaaaaaa/exec", json={"command": "cat",
                                                             "stdin": "y" * MIB})
        assert ran.status_code != 413, ran.text[:300]
        too_much = api.put("/api/v1/vms/vm_aaaaaaaa/files", params={"path": "/tmp/f"},
                           content=b"x" * (MAX_BODY + 1),
                           headers={"Content-Type": "application/json"})
        assert too_much.status_code == 413


def test_forms_are_capped_small_and_a_logout_without_a_session_is_not_read(
        server: Server) -> None:
    status, answer, _ = _raw_post(server, "/login", b"user=" + b"x" * (FORM_BODY + 10),
                                  Content_Type="application/x-www-form-urlencoded")
    assert status == 413, answer[:300]
    status, answer, _ = _raw_post(server, "/logout", b"csrf=" + b"x" * (4 * MIB),
                                     Content_Type="application/x-www-form-urlencoded")
    assert status == 303 and b"location: /login" in answer.lower(), answer[:300]


def _login_form(client: httpx.Client) -> str:
    page = client.get("/login")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text[:300]
    return found.group(1)


def test_forty_wrong_logins_at_once_leave_another_users_calls_prompt(server: Server) -> None:
    other = server.new_token("bob", "laptop")
    server.rift("user", "add", "carol")
    forms = []
    for _ in range(40):
        client = httpx.Client(base_url=server.url, timeout=30)
        forms.append((client, _login_form(client)))
    go = threading.Barrier(41)
    answers: list[int] = []

    def guess(client: httpx.Client, csrf: str) -> None:
        go.wait(10)
        answers.append(client.post("/login", data={"user": "carol", "password": "wrong-wrong",
                                                   "csrf": csrf}).status_code)

    threads = [threading.Thread(target=guess, args=form) for form in forms]
    for thread in threads:
        thread.start()
    took: list[float] = []
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {other}"}) as bob:
        bob.get("/api/v1/tasks")
        go.wait(10)
        while any(t.is_alive() for t in threads) or len(took) < 10:
            started = time.monotonic()
            assert bob.get("/api/v1/tasks").status_code == 200
            took.append(time.monotonic() - started)
    for thread in threads:
        thread.join(30)
    for client, _ in forms:
        client.close()
    # 3 free checks for carol from this address; the rest turned away unchecked
    assert answers.count(401) <= 3 and answers.count(429) >= 37, answers
    took.sort()
    # 40 argon2 checks at once made this 3.8 s on an idle machine; 2 s leaves room
    # for a loaded one (latency itself is bench/hostile's)
    assert took[-1] < 2.0, f"bob's slowest call took {took[-1]:.2f} s (median " \
        f"{took[len(took) // 2]:.3f} s)"


def test_a_large_body_parsed_off_the_loop_is_answered_like_a_small_one(server: Server) -> None:
    """Over 64 KiB a JSON body is parsed in a worker thread: same answers."""
    auth = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    route = server.url + "/api/v1/vms/vm_aaaaaaaa/exec"
    for size in (100, 100 * 1024, 4 * MIB):
        start = b'{"command": "cat", "wait_s": 0, "stdin": "' + b"x" * size
        broken = httpx.post(route, content=start, headers=auth, timeout=30)
        assert broken.status_code == 422, broken.text[:300]
        error = broken.json()["error"]
        assert error["code"] == "invalid_argument" and "not valid JSON" in error["message"]
        whole = httpx.post(route, content=start + b'"}', headers=auth, timeout=30)
        assert whole.status_code in (400, 404) and whole.json()["error"]["code"] in (
            "handle_required", "vm_not_found"), whole.text[:300]
