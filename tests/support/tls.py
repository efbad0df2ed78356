"""A CA of the test's own and a certificate it signs for `127.0.0.1`, `localhost`
and `*.<domain>` (SPEC §16: the tests make their own CA for `rift serve`'s TLS),
and the environment that makes a test domain resolve to the loopback address
(`resolve_plugin/rift_test_resolve.py`, a pytest plugin for a child pytest)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PLUGIN_DIR = Path(__file__).resolve().parent / "resolve_plugin"
PLUGIN = "rift_test_resolve"
RESOLVE_ENV = "RIFT_TEST_RESOLVE"  # `<domain>=<port>`: names under it go to 127.0.0.1:<port>


@dataclass(frozen=True)
class Tls:
    ca: str  # the CA's certificate (SSL_CERT_FILE for clients)
    cert: str  # RIFT_TLS_CERT
    key: str  # RIFT_TLS_KEY


def _cert(subject: str, key: Any, issuer: tuple[x509.Name, Any] | None,
          names: list[x509.GeneralName]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None),
                              critical=True))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_tls(folder: Path, domain: str) -> Tls:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("rift test CA", ca_key, None, [])
    cert = _cert("rift", key, (ca.subject, ca_key),
                 [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                  x509.DNSName("localhost"), x509.DNSName(f"*.{domain}")])
    pem = serialization.Encoding.PEM
    files = {"ca.pem": ca.public_bytes(pem), "cert.pem": cert.public_bytes(pem),
             "key.pem": key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        (folder / name).chmod(0o600)
    return Tls(str(folder / "ca.pem"), str(folder / "cert.pem"), str(folder / "key.pem"))


def resolving_env(domain: str, port: int, ca: str) -> dict[str, str]:
    """A child pytest's environment (beside `-p rift_test_resolve`): names under
    `domain` reach 127.0.0.1:`port` whatever port their URL says, and the CA is
    the one clients trust."""
    return {RESOLVE_ENV: f"{domain}={port}", "SSL_CERT_FILE": ca}
