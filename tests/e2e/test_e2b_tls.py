"""`rift serve` answers TLS itself when given RIFT_TLS_CERT and RIFT_TLS_KEY
(SPEC §16), so the E2B SDK's `https://<port>-<sandbox id>.<domain>` host names
work: with a CA this test makes, a certificate for `127.0.0.1` and
`*.<RIFT_PREVIEW_DOMAIN>`, and the test domain resolved by the test itself (to
the server's loopback port). On libvirt's test driver: no guest answers behind
the port (502), which shows the request reached the relay."""

from __future__ import annotations

import datetime
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.servers import start_server, stop_server

DOMAIN = "e2b.test"


def _cert(subject: str, key: Any, issuer: tuple[x509.Name, Any] | None,
          names: list[x509.GeneralName]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None),
                              critical=True))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(the server's https URL, its admin token, its port)."""
    tmp = tmp_path_factory.mktemp("e2b-tls")
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("rift test CA", ca_key, None, [])
    cert = _cert("rift", key, (ca.subject, ca_key),
                 [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                  x509.DNSName(f"*.{DOMAIN}")])
    pem = serialization.Encoding.PEM
    ca_file = _pem(tmp / "ca.pem", ca.public_bytes(pem))
    cert_file = _pem(tmp / "cert.pem", cert.public_bytes(pem))
    key_file = _pem(tmp / "key.pem", key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", ca_file)  # httpx trusts the test's CA only
        proc, srv = start_server(tmp, RIFT_TLS_CERT=cert_file, RIFT_TLS_KEY=key_file,
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
        assert httpx.get(host, timeout=10).status_code == 401
        reached = httpx.get(host, timeout=10, headers={
            "e2b-traffic-access-token": sandbox["trafficAccessToken"]})
        assert reached.status_code == 502 and "guest" in reached.text
    finally:
        httpx.delete(f"{url}/e2b/sandboxes/{sandbox['sandboxID']}",
                     headers={"X-API-Key": token}, timeout=60)
