"""`rift serve` answers TLS itself when given RIFT_TLS_CERT and RIFT_TLS_KEY
(SPEC §16), so the E2B SDK's `https://<port>-<sandbox id>.<domain>` host names
work: with a CA this test makes, a certificate for `127.0.0.1` and
`*.<RIFT_PREVIEW_DOMAIN>`, and the test domain resolved by the test itself (to
the server's loopback port). On libvirt's test driver: no guest answers behind
the port (502), which shows the request reached the relay."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import start_server, stop_server
from tests.support.tls import make_tls

DOMAIN = "e2b.test"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(the server's https URL, its admin token, its port)."""
    tmp = tmp_path_factory.mktemp("e2b-tls")
    tls = make_tls(tmp / "tls", DOMAIN)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", tls.ca)  # httpx trusts the test's CA only
        proc, srv = start_server(tmp, RIFT_TLS_CERT=tls.cert, RIFT_TLS_KEY=tls.key,
                                 RIFT_PREVIEW_DOMAIN=DOMAIN)
        try:
            yield srv.url, srv.token, srv.url.rsplit(":", 1)[1]
        finally:
            stop_server(proc)


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names under the test domain resolve to the loopback address."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith("." + DOMAIN):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_rift_answers_tls_and_a_sandboxs_port_host_name_over_it(
        tls_server: tuple[str, str, str], resolved: None) -> None:
    url, token, port = tls_server
    assert url.startswith("https://")
    assert httpx.get(url + "/healthz", timeout=10).status_code == 200
    with pytest.raises(httpx.HTTPError):  # plain HTTP is not served beside it
        httpx.get(url.replace("https://", "http://") + "/healthz", timeout=10)
    made = httpx.post(url + "/e2b/v2/sandboxes", headers={"X-API-Key": token},
                      json={"templateID": "base", "timeout": 60}, timeout=60)
    assert made.status_code == 201, made.text
    sandbox = made.json()
    assert sandbox["domain"] == DOMAIN
    host = f"https://8001-{sandbox['sandboxID']}.{DOMAIN}:{port}/"
    try:
        assert httpx.get(host, timeout=10).status_code == 403
        reached = httpx.get(host, timeout=10, headers={
            "e2b-traffic-access-token": sandbox["trafficAccessToken"]})
        assert reached.status_code == 502 and "guest" in reached.text
        # envd's port is Rift's own envd routes for that sandbox (the SDK's data plane
        # when no E2B_SANDBOX_URL is set): its access token, not the traffic token
        envd = f"https://49983-{sandbox['sandboxID']}.{DOMAIN}:{port}/health"
        access = {"X-Access-Token": sandbox["envdAccessToken"]}
        assert httpx.get(envd, timeout=10, headers=access).status_code == 204
        assert httpx.get(envd, timeout=10).status_code == 401
        elsewhere = {**access, "E2b-Sandbox-Id": "abcd2345"}  # the host name wins
        assert httpx.get(envd, timeout=10, headers=elsewhere).status_code == 204
        gone = envd.replace(sandbox["sandboxID"], "abcd2345")
        assert httpx.get(gone, timeout=10, headers=access).status_code == 502
    finally:
        httpx.delete(f"{url}/e2b/sandboxes/{sandbox['sandboxID']}",
                     headers={"X-API-Key": token}, timeout=60)
