"""A large body is parsed off the event loop (SPEC §15): against a real `rift serve`
(libvirt's test driver), `/healthz` keeps answering while a `/mcp` tools/call or
a REST call of tens of MiB is parsed, and the call is answered as a small one
would be (for `/mcp` in both of the SDK's transports: the stateless era's and the
handshake era's)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from rift.api.parsing import MAX_VALUES
from tests.support.raw_mcp import LEGACY, MODERN, RawMcp, sse_messages
from tests.support.servers import Server, start_server, stop_server

MIB = 1 << 20
# The slowest /healthz while a body is parsed: a stall is the whole parse on the loop
# (0.9 s and more here); a busy 2-core machine alone has made one answer take 0.5 s
HEALTHZ_WITHIN_S = 0.8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(tmp_path_factory.mktemp("rift"), RIFT_LOG_LEVEL="WARNING")
    try:
        yield srv
    finally:
        stop_server(proc)


def _write_file(server: Server, era: str, content: bytes) -> tuple[bytes, dict[str, str]]:
    """A `rift_vm_write_file` tools/call whose `content` is `content` (raw JSON), and
    its headers."""
    raw = RawMcp(server.url, server.token, era=era)
    params = {"name": "rift_vm_write_file", "arguments": {
        "handle": "task_nope.nope", "vm_id": "vm_aaaaaaaa", "path": "/tmp/f", "content": "@"}}
    body = json.dumps(raw.body("tools/call", params)).encode().replace(b'"@"', content)
    return body, raw.headers("tools/call", params) | {"Content-Type": "application/json"}


def _post(server: Server, body: bytes, headers: dict[str, str],
          status: tuple[int, ...] = (200, 400)) -> dict[str, Any]:
    """The JSON-RPC answer to one POST /mcp (as JSON or as an event stream)."""
    answer = httpx.post(server.url + "/mcp", content=body, headers=headers, timeout=120)
    assert answer.status_code in status, answer.text[:300]
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        messages = list(sse_messages(iter(answer.text.splitlines())))
    else:
        messages = [answer.json()]
    return next(m for m in messages if "result" in m or "error" in m)


def _refusal(answer: dict[str, Any]) -> tuple[str, str]:
    """A tool's refusal: (its code, its field), or the JSON-RPC error's code."""
    if "error" in answer:
        return "jsonrpc", str(answer["error"]["code"])
    error = answer["result"]["structuredContent"]["error"]
    return error["code"], str(error.get("details", {}).get("field", error.get("field")))


@contextmanager
def _healthz_meanwhile(server: Server) -> Iterator[list[tuple[float, float]]]:
    """/healthz asked again and again (each 10 ms after the last answer) while the
    block runs: (when it was asked, seconds to its answer) of each."""
    took: list[tuple[float, float]] = []
    stop = threading.Event()

    def ask() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                began = time.monotonic()
                assert client.get(server.url + "/healthz").status_code == 200
                took.append((began, time.monotonic() - began))
                stop.wait(0.01)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    time.sleep(0.2)
    try:
        yield took
    finally:
        stop.set()
        asker.join(60)


@pytest.mark.parametrize("era", [MODERN, LEGACY])
def test_a_30_mib_write_file_is_answered_as_a_small_one_and_healthz_meanwhile(
        server: Server, era: str) -> None:
    small = _post(server, *_write_file(server, era, b'"aGk="'))
    content = b'"' + b"\\n" * (15 * MIB) + b'"'  # 30 MiB of JSON escapes
    body, headers = _write_file(server, era, content)
    assert len(body) > 30 * MIB
    with _healthz_meanwhile(server) as took:
        began = time.monotonic()
        large = _post(server, body, headers)
        ended = time.monotonic()
    assert _refusal(large) == _refusal(small) == ("handle_invalid", "handle"), large
    during = [s for at, s in took if began <= at <= ended]
    assert during and max(s for _, s in took) < HEALTHZ_WITHIN_S, (ended - began, during)


@pytest.mark.parametrize("era", [MODERN, LEGACY])
def test_millions_of_small_values_are_refused_without_stalling_healthz(
        server: Server, era: str) -> None:
    """38 MiB of small numbers: about 0.9 s of parsing, which held the loop (and the
    GIL: a worker thread does not help) while every other call waited; parsed in
    the parser process, it is refused there (a large body carries its bulk in
    strings) and this server never builds its 19 million values."""
    numbers = b"[" + b"0," * (19 * MIB - 8) + b"0]"
    body, headers = _write_file(server, era, numbers)
    assert 37 * MIB < len(body) < 40 * MIB  # under the door's cap (MAX_BODY)
    with _healthz_meanwhile(server) as took:
        began = time.monotonic()
        answer = _post(server, body, headers, status=(413,))
        ended = time.monotonic()
    error = answer["error"]["data"]
    assert error["code"] == "invalid_argument" and error["limit_values"] == MAX_VALUES, error
    assert "in strings" in error["hint"]
    during = [s for at, s in took if began <= at <= ended]
    assert len(during) >= 3, (ended - began, during)
    assert max(s for _, s in took) < HEALTHZ_WITHIN_S, (ended - began, sorted(during)[-5:])


@pytest.mark.parametrize("era", [MODERN, LEGACY])
def test_a_large_body_that_is_not_json_is_a_parse_error_as_a_small_one(
        server: Server, era: str) -> None:
    for size in (10, 8 * MIB):
        body, headers = _write_file(server, era, b'"' + b"a" * size + b'"')
        answer = _post(server, body[:-1], headers)  # its last brace gone
        assert answer["error"]["code"] == -32700, answer


def _rest_write(server: Server, content: bytes) -> bytes:
    """A REST `PUT /api/v1/vms/{id}/files` body whose `content` is `content` (raw JSON)."""
    return json.dumps({"content": "@"}).encode().replace(b'"@"', content)


def _rest_put(server: Server, body: bytes) -> httpx.Response:
    return httpx.put(server.url + "/api/v1/vms/vm_aaaaaaaa/files", params={"path": "/tmp/f"},
                     content=body, timeout=120, headers={
                         "Authorization": f"Bearer {server.token}",
                         "Content-Type": "application/json", "Rift-Handle": "task_nope.nope"})


def test_rest_millions_of_small_values_are_refused_without_stalling_healthz(
        server: Server) -> None:
    """REST's large bodies go to the same parser process as `/mcp`'s (a worker thread
    held the GIL for the whole parse: /healthz waited as long)."""
    body = _rest_write(server, b"[" + b"0," * (7 * MIB) + b"0]")
    with _healthz_meanwhile(server) as took:
        began = time.monotonic()
        answer = _rest_put(server, body)
        ended = time.monotonic()
    assert answer.status_code == 413, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "invalid_argument" and error["limit_values"] == MAX_VALUES, error
    during = [s for at, s in took if began <= at <= ended]
    assert during and max(s for _, s in took) < HEALTHZ_WITHIN_S, (ended - began, during)


@pytest.mark.parametrize("size", [10, 8 * MIB])
def test_rest_a_large_body_is_answered_as_a_small_one(server: Server, size: int) -> None:
    """Parsed in the parser process (8 MiB) or here (10 bytes), the same answers."""
    good = _rest_put(server, _rest_write(server, b'"' + b"a" * size + b'"'))
    assert good.status_code == 400, good.text[:300]  # parsed; then the handle refused
    assert good.json()["error"]["code"] == "handle_invalid", good.text[:300]
    broken = _rest_put(server, _rest_write(server, b'"' + b"a" * size + b'"')[:-1])
    assert broken.status_code == 422, broken.text[:300]
    error = broken.json()["error"]
    assert error["code"] == "invalid_argument" and error["field"] == "body", error
    assert error["message"] == ("body: is not valid JSON: Expecting ',' delimiter at "
                                f"character {size + 14}"), error
