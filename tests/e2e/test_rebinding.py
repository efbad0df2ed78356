"""No DNS rebinding (SPEC §5): every door of a real `rift serve` refuses a `Host`
or `Origin` that is not Rift's own, in every MCP protocol era; the MCP project's
own conformance scenario agrees."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from rift.api.rebinding import allowed_hosts
from tests.support.js_clients import bearer_proxy, conformance
from tests.support.servers import Server, start_server, stop_server

EVIL = "evil.example.com"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "rebinding-test", "version": "1"}}}
ERAS = ("2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26")


def _mcp(server: Server, era: str, host: str, origin: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.token}", "Host": host,
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": era, "Mcp-Method": "tools/list"}
    if origin is not None:
        headers["Origin"] = origin
    if era == "2026-07-28":
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": era,
            "io.modelcontextprotocol/clientInfo": {"name": "rebinding-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}}}
    else:
        body = {**INITIALIZE, "params": {**INITIALIZE["params"], "protocolVersion": era}}
        headers.pop("MCP-Protocol-Version")
        headers.pop("Mcp-Method")
    return httpx.post(server.url + "/mcp", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("era", ERAS)
def test_mcp_refuses_another_sites_host_and_origin_in_every_era(server: Server,
                                                                  era: str) -> None:
    own = urlsplit(server.url).netloc
    assert _mcp(server, era, own).status_code == 200
    assert _mcp(server, era, own, f"http://{own}").status_code == 200
    assert _mcp(server, era, own.replace("127.0.0.1", "localhost")).status_code == 200
    foreign = _mcp(server, era, EVIL)
    assert foreign.status_code == 421, foreign.text
    error = foreign.json()["error"]
    assert error["data"]["code"] == "invalid_argument" and error["data"]["field"] == "Host"
    assert "RIFT_ALLOWED_HOSTS" in error["data"]["hint"]
    assert _mcp(server, era, own, f"http://{EVIL}").status_code == 403


def test_rest_and_the_boxes_page_refuse_another_sites_host_and_origin(server: Server) -> None:
    own = urlsplit(server.url).netloc
    auth = {"Authorization": f"Bearer {server.token}"}
    for path in ("/api/v1/tasks", "/", "/login", "/metrics", "/openapi.json"):
        fine = httpx.get(server.url + path, headers={**auth, "Host": own}, timeout=30)
        assert fine.status_code in (200, 303), (path, fine.status_code)
        foreign = httpx.get(server.url + path, headers={**auth, "Host": EVIL}, timeout=30)
        assert foreign.status_code == 421, (path, foreign.status_code)
        assert foreign.json()["error"]["field"] == "Host"
        cross = httpx.get(server.url + path, timeout=30,
                          headers={**auth, "Host": own, "Origin": f"https://{EVIL}"})
        assert cross.status_code == 403, (path, cross.status_code)
    made = httpx.post(server.url + "/api/v1/tasks", json={"name": "rebound"}, timeout=30,
                      headers={**auth, "Host": EVIL, "Origin": f"http://{EVIL}"})
    assert made.status_code == 421
    listed = httpx.get(server.url + "/api/v1/tasks?status=all", headers=auth, timeout=30)
    assert "rebound" not in listed.text  # refused before anything ran
    # A load balancer probing by address still gets its answer (no token, no data).
    assert httpx.get(server.url + "/healthz", headers={"Host": "10.9.8.7:80"},
                     timeout=30).status_code == 200


def test_the_conformance_scenario_dns_rebinding_protection_passes(server: Server) -> None:
    """@modelcontextprotocol/conformance's scenario sends no token; a loopback proxy
    adds Rift's and passes `Host` and `Origin` through as the scenario set them."""
    with bearer_proxy(urlsplit(server.url).port or 80, server.token) as port:
        checks = conformance(f"http://localhost:{port}/mcp", "dns-rebinding-protection")
    verdicts = {c["id"]: c["status"] for c in checks}
    assert verdicts == {"localhost-host-rebinding-rejected": "SUCCESS",
                        "localhost-host-valid-accepted": "SUCCESS"}, checks


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(tmp_path_factory.mktemp("public"),
                             RIFT_PUBLIC_URL="https://rift.example.com/")
    try:
        yield srv
    finally:
        stop_server(proc)


def test_the_public_urls_host_is_answered_too(public: Server) -> None:
    auth = {"Authorization": f"Bearer {public.token}"}
    for host, status in (("rift.example.com", 200), ("other.example.com", 421)):
        got = httpx.get(public.url + "/api/v1/tasks", headers={**auth, "Host": host},
                        timeout=30)
        assert got.status_code == status, (host, got.text)


def test_allowed_hosts_default_to_the_listening_address_loopback_and_public_url(
        tmp_path: Path) -> None:
    loopback = allowed_hosts(None, None, "127.0.0.1")
    assert {"127.0.0.1:*", "localhost:*", "[::1]:*", "localhost"} <= set(loopback)
    assert EVIL not in " ".join(loopback)
    assert "10.1.2.3:*" in allowed_hosts(None, None, "10.1.2.3")
    assert "[fd00::1]:*" in allowed_hosts(None, None, "fd00::1")
    assert "rift.example.com:8443" in allowed_hosts(None, "https://rift.example.com:8443/x",
                                                    None)
    assert allowed_hosts("a.example, b.example:*", "https://c.example", None) == [
        "a.example", "b.example:*"]
    assert allowed_hosts("*", None, None) == ["*"]
