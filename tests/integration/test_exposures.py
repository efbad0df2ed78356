"""Exposures (SPEC §13): the engine's rules on a SQLite store and fake hypervisors,
and the proxy over real HTTP (uvicorn on a loopback port) to real HTTP servers of
the test's standing in for guest ports (the fake guest shell's `open_port`
connects to them, where the real one opens an SSH `direct-tcpip` channel)."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import resource
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from rift.app import create_app
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.domain.secrets import digest
from rift.services.context import Deps, ExposureUrls
from rift.services.lifecycle import exposures, pauses, sleeps, tasks, vms
from tests.support import ws
from tests.support.engine import ALICE, BOB, event_types, refused
from tests.support.fake_guest import FakeFiles, FakeLifecycle, fake_guests
from tests.support.vm_rows import give_ssh_address

GUEST_PORT = 8000
WS_PORT = 8100


class GuestHandler(http.server.BaseHTTPRequestHandler):
    """What a guest's web server answers: its request echoed as JSON; `/stream`
    writes two chunks with a pause the test controls; `/big` MiB of zeros."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"data: one\n\n")
            GuestHandler.release.wait(10)
            self._chunk(b"data: two\n\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/big/"):
            size = int(self.path.split("/")[2]) * 2**20
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = bytes(2**16)
            for _ in range(size // len(block)):
                self.wfile.write(block)
            return
        self._echo(b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        seen = 0
        while seen < length:
            got = self.rfile.read(min(2**16, length - seen))
            if not got:
                break
            seen += len(got)
        self._echo(str(seen).encode())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _echo(self, body: bytes) -> None:
        answer = json.dumps({"path": self.path, "method": self.command, "body": body.decode(),
                             "headers": {k.lower(): v for k, v in self.headers.items()}})
        data = answer.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Set-Cookie", "guest=1; Path=/")
        self.send_header("Referrer-Policy", "unsafe-url")  # Rift answers no-referrer
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def guest_server() -> Iterator[tuple[str, int]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GuestHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    GuestHandler.release.clear()
    try:
        yield ("127.0.0.1", server.server_address[1])
    finally:
        GuestHandler.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def shell(guest_server: tuple[str, int]) -> FakeFiles:
    return FakeFiles(ports={GUEST_PORT: guest_server})


@pytest.fixture
def gdeps(deps: Deps, shell: FakeFiles) -> Deps:
    return replace(deps, guests=fake_guests(files=shell),
                   exposure_urls=ExposureUrls("http://rift.test:8080"))


def _vm(deps: Deps) -> tuple[str, str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id, opened.task.id


def _secret(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[1]


# -- the engine ----------------------------------------------------------------------------

def test_an_exposure_answers_its_url_once_and_the_vm_view_lists_only_its_port(
        gdeps: Deps) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    made = exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
               port=GUEST_PORT)).exposure
    secret = _secret(made.url)
    assert made.url == f"http://rift.test:8080/x/{secret}/"
    assert len(secret) == 32 and (made.vm_id, made.port) == (vm_id, GUEST_PORT)
    view = vms.get(gdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm
    assert [(p.port, p.created_at) for p in view.exposures] == [(GUEST_PORT, made.created_at)]
    assert secret not in json.dumps(view.model_dump())
    assert secret not in json.dumps(tasks.get(gdeps, ALICE, command(c.TaskGetIn,
                                        task_id=task_id)).task.model_dump())
    with gdeps.store.read() as tx:  # only the digest is kept
        kept = tx.exposures.all()
    assert [e.digest for e in kept] == [digest(secret)] and secret not in repr(kept)
    target = exposures.resolve(gdeps, secret)
    assert target is not None and (target.vm.id, target.port) == (vm_id, GUEST_PORT)
    assert "vm_exposed" in event_types(gdeps, task_id)


def test_exposing_again_ends_the_old_url_and_unexpose_ends_the_new_one(gdeps: Deps) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    first = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                        port=GUEST_PORT)).exposure.url)
    second = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=GUEST_PORT)).exposure.url)
    assert first != second
    assert exposures.resolve(gdeps, first) is None
    assert exposures.resolve(gdeps, second) is not None
    assert len(vms.get(gdeps, ALICE, command(c.VmGetIn, vm_id=vm_id)).vm.exposures) == 1
    view = exposures.unexpose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
               port=GUEST_PORT)).vm
    assert view.exposures == [] and exposures.resolve(gdeps, second) is None
    again = exposures.unexpose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                port=GUEST_PORT)).vm  # changes nothing
    assert again.exposures == []
    assert event_types(gdeps, task_id).count("vm_unexposed") == 1


def test_destroying_the_vm_or_closing_the_task_ends_its_exposures(gdeps: Deps) -> None:
    handle, vm_id, _task_id = _vm(gdeps)
    secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=GUEST_PORT)).exposure.url)
    vms.destroy(gdeps, ALICE, command(c.VmDestroyIn, vm_id=vm_id, handle=handle))
    assert exposures.resolve(gdeps, secret) is None
    handle, vm_id, _task_id = _vm(gdeps)
    secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=GUEST_PORT)).exposure.url)
    tasks.close(gdeps, ALICE, command(c.TaskCloseIn, handle=handle))
    assert exposures.resolve(gdeps, secret) is None
    with gdeps.store.read() as tx:
        assert tx.exposures.all() == []


def test_a_pause_keeps_the_exposure_and_its_vm_says_it_is_paused(gdeps: Deps) -> None:
    handle, vm_id, _task_id = _vm(gdeps)
    secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=GUEST_PORT)).exposure.url)
    paused = pauses.pause(gdeps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id)).vm
    assert paused.status == "paused" and [p.port for p in paused.exposures] == [GUEST_PORT]
    target = exposures.resolve(gdeps, secret)
    assert target is not None and target.vm.status == "paused"
    resumed = pauses.resume(gdeps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id)).vm
    assert [p.port for p in resumed.exposures] == [GUEST_PORT]


def test_bad_exposures_are_refused_and_change_nothing(gdeps: Deps) -> None:
    handle, vm_id, _task_id = _vm(gdeps)
    for port in (0, 65536, -1):
        err = refused("invalid_argument", lambda port=port: exposures.expose(
            gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id, port=port)))
        assert err.details["field"] == "port"
    refused("task_not_found", lambda: exposures.expose(gdeps, BOB, command(c.VmPortIn,
                                  handle=handle, vm_id=vm_id, port=GUEST_PORT)))
    other = tasks.new(gdeps, ALICE, command(c.TaskNewIn))
    refused("vm_not_found", lambda: exposures.expose(gdeps, ALICE, command(c.VmPortIn,
                                handle=str(other.handle), vm_id=vm_id, port=GUEST_PORT)))
    pauses.pause(gdeps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
    err = refused("vm_not_running", lambda: exposures.expose(gdeps, ALICE, command(c.VmPortIn,
                                        handle=handle, vm_id=vm_id, port=GUEST_PORT)))
    assert "rift_vm_resume" in err.hint
    with gdeps.store.read() as tx:
        assert tx.exposures.all() == []
    assert exposures.resolve(gdeps, "not-a-secret") is None


# -- the proxy, over HTTP ------------------------------------------------------------------

class Served:
    def __init__(self, deps: Deps, settings: Settings) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings, deps), host="127.0.0.1",
                                                    port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(gdeps: Deps, tmp_path: Path) -> Iterator[Served]:
    settings = Settings(data_dir=tmp_path, hypervisor_uri="fake:///local",
                        preview_domain="preview.test")
    running = Served(gdeps, settings)
    try:
        yield running
    finally:
        running.stop()


def test_a_request_reaches_the_guest_port_with_its_path_body_and_forwarded_headers(
        gdeps: Deps, served: Served, caplog: pytest.LogCaptureFixture) -> None:
    handle, vm_id, _task_id = _vm(gdeps)
    secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=GUEST_PORT)).exposure.url)
    caplog.set_level(logging.INFO)
    with httpx.Client(base_url=served.url, timeout=30) as client:
        got = client.get(f"/x/{secret}/some/page?q=1", headers={
            "Cookie": "rift_session=abc", "Rift-Handle": "task_x.y",
            "E2b-Traffic-Access-Token": "rift_traffic_x", "X-Mine": "kept"})
        assert got.status_code == 200, got.text
        seen = got.json()
        assert (seen["path"], seen["method"]) == ("/some/page?q=1", "GET")
        assert seen["headers"]["host"] == f"localhost:{GUEST_PORT}"
        assert seen["headers"]["x-forwarded-host"] == f"127.0.0.1:{served.port}"
        assert "cookie" not in seen["headers"]  # Rift's own cookies stay with Rift
        assert "rift-handle" not in seen["headers"]  # and the credentials sent for it
        assert "e2b-traffic-access-token" not in seen["headers"]
        assert seen["headers"]["x-mine"] == "kept"
        assert "set-cookie" not in got.headers  # nor may a guest set any on Rift's origin
        assert got.headers["content-security-policy"].startswith("sandbox")
        block, blocks = bytes(range(256)) * 256, 1600  # 100 MiB up, sent as it is made
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        posted = client.post(f"/x/{secret}/upload", content=(block for _ in range(blocks)),
                             headers={"Content-Length": str(len(block) * blocks)})
        assert posted.status_code == 200 and posted.json()["body"] == str(len(block) * blocks)
        size = 0
        with client.stream("GET", f"/x/{secret}/big/100") as big:  # 100 MiB down
            for part in big.iter_bytes():
                size += len(part)
        assert size == 100 * 2**20
        # Rift (in this process) streamed both: its peak memory grew by far less than
        # either body (a proxy that held one whole would have grown by 100 MiB).
        grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
        assert grew_mib < 40, f"peak memory grew {grew_mib:.0f} MiB for 100 MiB bodies"
        assert client.get(f"/x/{secret}").json()["path"] == "/"
    ours = [r for r in caplog.records if r.name.startswith("rift")]
    assert not [r for r in ours if secret in str(r.__dict__)]
    paths = [getattr(r, "path", None) for r in ours if r.msg == "request"]
    assert len(paths) >= 3 and set(paths) == {"/x/…"}  # the last may log after this


def test_a_stream_from_the_guest_arrives_as_it_is_written(gdeps: Deps, served: Served) -> None:
    handle, vm_id, _task_id = _vm(gdeps)
    secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=GUEST_PORT)).exposure.url)
    with httpx.Client(base_url=served.url, timeout=30) as client, \
            client.stream("GET", f"/x/{secret}/stream") as events:
        assert events.headers["content-type"] == "text/event-stream"
        parts = events.iter_bytes()
        first = next(parts)
        assert first == b"data: one\n\n"  # before the guest writes the second
        GuestHandler.release.set()
        rest = b"".join(parts)
    assert rest == b"data: two\n\n"


def test_unknown_ended_and_unreachable_exposures_answer_plainly(
        gdeps: Deps, served: Served, shell: FakeFiles) -> None:
    handle, vm_id, _task_id = _vm(gdeps)
    ended = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                        port=GUEST_PORT)).exposure.url)
    exposures.unexpose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
        port=GUEST_PORT))
    closed = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=9)).exposure.url)  # nothing listens
    with httpx.Client(base_url=served.url, timeout=30) as client:
        unknown = client.get("/x/" + "a" * 32 + "/")
        gone = client.get(f"/x/{ended}/")
        assert (unknown.status_code, gone.status_code) == (404, 404)
        assert unknown.text == gone.text
        assert client.get("/x/short/").status_code == 404
        refused_port = client.get(f"/x/{closed}/")
        assert refused_port.status_code == 502 and "port 9" in refused_port.text
        secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle,
                             vm_id=vm_id, port=GUEST_PORT)).exposure.url)
        pauses.pause(gdeps, ALICE, command(c.VmHeldIn, handle=handle, vm_id=vm_id))
        paused = client.get(f"/x/{secret}/")
        assert paused.status_code == 503 and "rift_vm_resume" in paused.text
        assert client.get("/healthz").json() == {"status": "ok"}  # the API is still the API


def test_a_request_to_a_sleeping_vms_url_wakes_it_and_is_answered_by_its_guest(
        gdeps: Deps, served: Served, clock: FakeClock) -> None:
    handle, vm_id, task_id = _vm(gdeps)
    secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle,
                         vm_id=vm_id, port=GUEST_PORT)).exposure.url)
    clock.advance(900 + 60 + 1)  # RIFT_TASK_SLEEP_S and one activity step
    assert sleeps.sleep_quiet(gdeps) == [vm_id]
    with httpx.Client(base_url=served.url, timeout=30) as client:
        got = client.get(f"/x/{secret}/after/sleep")
    assert got.status_code == 200 and got.json()["path"] == "/after/sleep"
    with gdeps.store.read() as tx:
        vm = tx.vms.get(vm_id)
        woke = [e for e in tx.events.page(task_id, 0, 100) if e.type == "vm_woke"]
    assert vm is not None and vm.status == "running"
    assert [e.actor for e in woke] == ["exposure"]
    life = gdeps.guests.lifecycle
    # woken for an exposure: the guest is left to the request, the clock set after it
    assert isinstance(life, FakeLifecycle) and life.woken_by == [(vm_id, "exposure")]


def test_a_preview_domain_reaches_the_exposure_by_its_host_name(gdeps: Deps,
                                                                  served: Served) -> None:
    deps = replace(gdeps, exposure_urls=ExposureUrls("http://rift.test", "preview.test"))
    handle, vm_id, _task_id = _vm(deps)
    made = exposures.expose(deps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
               port=GUEST_PORT)).exposure
    secret = made.url.removeprefix("https://").split(".", 1)[0]
    assert made.url == f"https://{secret}.preview.test/"
    with httpx.Client(base_url=served.url, timeout=30) as client:
        got = client.get("/app/?x=2", headers={"Host": f"{secret}.preview.test:8443"})
        assert got.status_code == 200 and got.json()["path"] == "/app/?x=2"
        assert "content-security-policy" not in got.headers  # an origin of its own
        assert got.headers.get("set-cookie") == "guest=1; Path=/"
        other = client.get("/", headers={"Host": "b" * 32 + ".preview.test"})
        assert other.status_code == 404


def test_the_guest_never_sees_the_clients_token_cookies_or_handle(
        gdeps: Deps, served: Served) -> None:
    """SPEC §15: `Authorization`, `Cookie` and `Rift-Handle` stay with Rift, under
    Rift's origin and under a preview domain alike; every answer, the guest's and
    Rift's own refusals, says `Referrer-Policy: no-referrer` (the URL is the secret)."""
    handle, vm_id, _task_id = _vm(gdeps)
    private = {"Authorization": "Bearer rift_" + "t" * 43, "Cookie": "rift_session=abc; sso=1",
               "Rift-Handle": handle, "X-Mine": "kept"}
    preview = replace(gdeps, exposure_urls=ExposureUrls("http://rift.test", "preview.test"))
    made = exposures.expose(preview, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
               port=GUEST_PORT)).exposure.url
    secret = made.removeprefix("https://").split(".", 1)[0]  # /x/<secret>/ reaches it too
    with httpx.Client(base_url=served.url, timeout=30) as client:
        for path, host in ((f"/x/{secret}/page", None), ("/page", f"{secret}.preview.test")):
            headers = {**private, **({"Host": host} if host else {})}
            for got in (client.get(path, headers=headers),
                        client.post(path, headers=headers, content=b"body")):
                assert got.status_code == 200, got.text
                seen = got.json()["headers"]
                assert not {"authorization", "cookie", "rift-handle"} & set(seen), seen
                assert handle not in json.dumps(seen) and "rift_session" not in json.dumps(seen)
                assert seen["x-mine"] == "kept"  # the guest's own headers still pass
                assert got.headers.get_list("referrer-policy") == ["no-referrer"]
        for refused_path in ("/x/" + "a" * 32 + "/", "/x/short/"):
            refused_answer = client.get(refused_path, headers=private)
            assert refused_answer.status_code == 404
            assert refused_answer.headers["referrer-policy"] == "no-referrer"


def test_a_websocket_to_the_guest_carries_none_of_rifts_secrets(
        gdeps: Deps, shell: FakeFiles, served: Served) -> None:
    seen: list[dict[str, str]] = []
    handle, vm_id, _task_id = _vm(gdeps)
    with ws.echo_server(seen) as address:
        shell.ports[WS_PORT] = address
        secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle,
                             vm_id=vm_id, port=WS_PORT)).exposure.url)
        extra = [("Authorization", "Bearer rift_" + "t" * 43), ("Cookie", "rift_session=abc"),
                 ("Rift-Handle", handle), ("X-Mine", "kept")]
        with ws.Client(("127.0.0.1", served.port), f"127.0.0.1:{served.port}",
                       f"/x/{secret}/", extra_headers=extra) as client:
            client.open()
            client.send("hello")
            assert client.receive() == "echo: hello"
            assert client.close() == 1000
    assert len(seen) == 1
    assert not {"authorization", "cookie", "rift-handle"} & set(seen[0]), seen
    assert seen[0]["x-mine"] == "kept"


def test_two_hundred_requests_at_once_all_answer(gdeps: Deps, served: Served) -> None:
    handle, vm_id, _task_id = _vm(gdeps)
    secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
                         port=GUEST_PORT)).exposure.url)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    with httpx.Client(base_url=served.url, timeout=60, limits=limits) as client, \
            ThreadPoolExecutor(max_workers=200) as pool:
        answers = list(pool.map(lambda i: client.get(f"/x/{secret}/n/{i}"), range(200)))
    assert [a.status_code for a in answers] == [200] * 200
    assert sorted(a.json()["path"] for a in answers) == sorted(f"/n/{i}" for i in range(200))


def test_a_guest_that_never_answers_or_sends_an_endless_head_costs_one_connection(
        gdeps: Deps, served: Served, shell: FakeFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest port that takes requests and never answers, and one that answers an
    endless header (as much as the relay reads, up to 1 GiB): the first times out
    (504), the second is cut at the relay's head limit (502), and the exposure of a
    healthy port answers at once all the while."""
    monkeypatch.setattr("rift.api.relays.HEAD_S", 3.0)
    silent, endless = socket.create_server(("127.0.0.1", 0)), socket.create_server(
        ("127.0.0.1", 0))
    sent = [0]
    held: list[socket.socket] = []

    def hold() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(silent.accept()[0])

    def flood() -> None:
        with contextlib.suppress(OSError):
            conn, _ = endless.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Big: ")
                while sent[0] < 2**30:
                    conn.sendall(b"a" * 65536)
                    sent[0] += 65536

    for fn in (hold, flood):
        threading.Thread(target=fn, daemon=True).start()
    shell.ports[8201] = silent.getsockname()
    shell.ports[8202] = endless.getsockname()
    handle, vm_id, _task_id = _vm(gdeps)
    urls = {port: _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle,
                              vm_id=vm_id, port=port)).exposure.url)
            for port in (GUEST_PORT, 8201, 8202)}
    try:
        with httpx.Client(base_url=served.url, timeout=30) as client, \
                ThreadPoolExecutor(max_workers=8) as pool:
            stuck = [pool.submit(client.get, f"/x/{urls[8201]}/") for _ in range(4)]
            flooded = pool.submit(client.get, f"/x/{urls[8202]}/")
            time.sleep(0.5)  # the stuck requests wait on their guest now
            healthy = [client.get(f"/x/{urls[GUEST_PORT]}/h/{i}") for i in range(5)]
            assert [h.status_code for h in healthy] == [200] * 5
            assert not any(f.done() for f in stuck)  # answered while they still waited
            assert flooded.result().status_code == 502
            assert [f.result().status_code for f in stuck] == [504] * 4
    finally:
        for sock in (silent, endless, *held):
            sock.close()
    assert sent[0] < 64 * 2**20, sent[0]  # read no further than the flow window allows


def test_a_websocket_reaches_the_guest_port_both_ways(gdeps: Deps, shell: FakeFiles,
                                                      served: Served) -> None:
    rift = ("127.0.0.1", served.port)
    host = f"127.0.0.1:{served.port}"
    with ws.echo_server() as address:
        shell.ports[WS_PORT] = address
        handle, vm_id, _task_id = _vm(gdeps)
        secret = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle,
                             vm_id=vm_id, port=WS_PORT)).exposure.url)
        with ws.Client(rift, host, f"/x/{secret}/chat?room=1", ["chat"]) as client:
            assert client.open() == "chat"  # the guest's choice of subprotocol
            client.send("hello")
            assert client.receive() == "echo: hello"
            blob = bytes(range(256)) * 1024
            client.send(blob)
            assert client.receive() == blob  # its two fragments, joined
            client.send("ping me")  # the guest pings first: Rift answers it
            assert client.receive() == "echo: ping me"
            assert client.close() == 1000
        exposures.unexpose(gdeps, ALICE, command(c.VmPortIn, handle=handle, vm_id=vm_id,
            port=WS_PORT))
        for target in ("/x/" + "a" * 32 + "/", f"/x/{secret}/"):  # unknown, and ended
            with ws.Client(rift, host, target) as refused_ws, \
                    pytest.raises(ConnectionRefusedError) as info:
                refused_ws.open()
            assert info.value.args[0] == 404
        plain = _secret(exposures.expose(gdeps, ALICE, command(c.VmPortIn, handle=handle,
                            vm_id=vm_id, port=GUEST_PORT)).exposure.url)
        with ws.Client(rift, host, f"/x/{plain}/") as not_ws, \
                pytest.raises(ConnectionRefusedError) as info:  # HTTP there, not a WebSocket
            not_ws.open()
        assert info.value.args[0] == 502
