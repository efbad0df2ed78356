"""RIFT_GUEST_CA_FILE on real `debian` guests (SPEC §19): a site beyond the host
(a network namespace of the test's own, as in test_real_egress.py) answers HTTPS
with a certificate of the test's own CA, as a TLS-inspecting proxy's would, and
serves a pip index of the test wheel. Without the setting a guest's `curl`,
Python's `urllib` and `pip download` refuse it (the certificate is not
trusted); with it, after a restart, a pooled VM started before the restart (it
gets the file at its hand-out) and one its pool starts afterwards (at its first
login; make soak's only: the pool's refill is a third debian boot) reach it
with all three, and `pip install` too."""

from __future__ import annotations

import datetime
import ipaddress
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mcp.client.session import ClientSession

from rift.guest.trust import DIGEST_PATH, load_guest_ca
from tests.support import netns
from tests.support.guest_packages import WHEEL_GREETING, WHEEL_MODULE, make_wheel
from tests.support.mcp_clients import call, mcp_session, run
from tests.support.netns import namespace, serving, wait_listening
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import Server, real_vms_missing, wait_until
from tests.support.soak import SOAK, long_form

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

BOOT_S = 120
CHORE_S = 240  # a venv and pip under a busy guest
SITE = "10.213.31.2"  # the namespace's end of its veth pair; the host's is .1
URL = f"https://{SITE}:8443"
INDEX = f"{URL}/simple/"


def _clear_pools(srv: Server) -> None:
    srv.rift("pool", "clear", "debian")


REAL = RealSettings(debian=True, before_stop=_clear_pools,
                    env={"RIFT_VM_BOOT_TIMEOUT_S": str(BOOT_S), "RIFT_SWEEP_INTERVAL_S": "5"})


def _cert(name: x509.Name, key: Any, issuer: tuple[x509.Name, Any], ca: bool,
          ips: list[str]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer[0])
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ips:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]), critical=False)
    return builder.sign(issuer[1], hashes.SHA256())


def _pki(folder: Path) -> tuple[Path, Path, Path]:
    """(the CA's certificate, the site's certificate and its key): the CA is what an
    inspecting proxy's authority stands for."""
    pem = serialization.Encoding.PEM
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rift test inspecting CA")])
    ca = _cert(ca_name, ca_key, (ca_name, ca_key), True, [])
    site = _cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SITE)]), key,
                 (ca_name, ca_key), False, [SITE])
    files = (folder / "ca.pem", folder / "site.pem", folder / "site.key")
    files[0].write_bytes(ca.public_bytes(pem))
    files[1].write_bytes(site.public_bytes(pem))
    files[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return files


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The HTTPS site in a namespace of its own (a page and a pip index of the test
    wheel); answers the CA's certificate file."""
    folder = tmp_path_factory.mktemp("guest-ca")
    ca, cert, key = _pki(folder)
    root = folder / "site"
    wheel = make_wheel(folder)
    (root / "simple" / WHEEL_MODULE).mkdir(parents=True)
    (root / "hello.txt").write_text("hello over inspected TLS\n")
    (root / "simple" / WHEEL_MODULE / wheel.name).write_bytes(wheel.read_bytes())
    (root / "simple" / WHEEL_MODULE / "index.html").write_text(
        f'<a href="{wheel.name}">{wheel.name}</a>\n')
    with namespace("ca", "10.213.31.1/30", [f"{SITE}/30"]) as ns, \
            serving(ns, netns.FILES, str(root), str(cert), str(key), SITE):
        wait_listening(SITE, 8443)
        yield ca


# Three TLS clients of a debian guest, each fetching from the site.
CLIENTS = {
    "curl": f"curl -sS -m 20 {URL}/hello.txt",
    "urllib": f"python3 -c 'import urllib.request; "
              f"print(urllib.request.urlopen(\"{URL}/hello.txt\", timeout=20).read().decode())'",
    "pip download": (f"pip3 download --no-cache-dir --disable-pip-version-check "
                     f"--timeout 20 --retries 0 --no-deps --index-url {INDEX} "
                     f"-d /tmp/dl-$$ {WHEEL_MODULE}"),
}


async def _exec(s: ClientSession, handle: str, vm_id: str, command: str) -> dict[str, Any]:
    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, command=command,
                      timeout_s=CHORE_S, wait_s=CHORE_S)
    assert not done["timed_out"], done
    return done


async def _clients(s: ClientSession, handle: str, vm_id: str) -> dict[str, tuple[int, str]]:
    """Each client's exit status and what it said (stdout; on a failure with the end
    of stderr: pip says why it found nothing on stdout, as information)."""
    seen = {}
    for name, command in CLIENTS.items():
        done = await _exec(s, handle, vm_id, command)
        said = done["stdout"] + ("" if done["exit_code"] == 0 else done["stderr"][-2000:])
        seen[name] = (done["exit_code"], said)
    return seen


def _pooled(srv: Server) -> bool:
    listed = srv.rift("pool", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    return bool(rows) and all(r["running"]["ready"] == r["running"]["want"] for r in rows)


# A VM pooled before the restart gets the file at its hand-out; one its pool starts
# after it, at its first login (make soak's: one more debian boot)
LEGS = ("pooled before the restart",) + (("pooled after it",) if SOAK else ())


@pytest.mark.timeout(3 * BOOT_S + 6 * CHORE_S + 240)
@long_form("tests/unit/test_guest_trust.py (the file's checks, the command that installs "
           "it in a folder standing for a guest's root, when a guest is given it)")
def test_debian_guests_trust_the_operators_ca_once_it_is_set_pooled_vms_of_before_too(
        rig: Rig, site: Path) -> None:
    ca = load_guest_ca(site)
    before = rig.server
    made = before.rift("pool", "set", "debian", "--running", "1")
    assert made.returncode == 0, made.stderr
    seen: dict[str, Any] = {}

    async def without() -> None:
        async with mcp_session(before.url, before.token) as s:
            handle = (await call(s, "rift_task_new", name="no guest CA"))["handle"]
            # a disk of its own size: a cold boot, not the pool's VM
            vm = (await call(s, "rift_vm_new", handle=handle, image="debian",
                             disk_gib=11))["vm"]
            assert vm["start"]["kind"] == "boot", vm
            seen["without"] = await _clients(s, handle, vm["id"])
            await call(s, "rift_task_close", handle=handle)

    run(without, BOOT_S + 3 * CHORE_S)
    for name, (status, said) in seen["without"].items():
        assert status != 0 and "hello over" not in said, (name, status, said)
        assert "certificate" in said.lower() or "CERTIFICATE" in said, (name, said)

    wait_until(lambda: _pooled(before), 2 * BOOT_S, "the debian pool is filled", every_s=1)
    after = rig.restart(RIFT_GUEST_CA_FILE=str(site))

    async def with_ca() -> None:
        async with mcp_session(after.url, after.token) as s:
            handle = (await call(s, "rift_task_new", name="guest CA"))["handle"]
            for label in LEGS:
                if label == "pooled after it":
                    wait_until(lambda: _pooled(after), 2 * BOOT_S, "the pool refilled",
                               every_s=1)
                started = time.monotonic()
                vm = (await call(s, "rift_vm_new", handle=handle, image="debian"))["vm"]
                seen[f"{label}: hand-out s"] = round(time.monotonic() - started, 2)
                assert vm["start"]["kind"] == "pool", vm
                seen[label] = await _clients(s, handle, vm["id"])
                digest = await _exec(s, handle, vm["id"], f"cat {DIGEST_PATH}")
                assert digest["stdout"].strip() == ca.digest, digest
                if label == "pooled before the restart":  # (a venv costs 40 s here)
                    began = time.monotonic()
                    done = await _exec(s, handle, vm["id"], (
                        f"pip3 install -q --no-cache-dir --disable-pip-version-check "
                        f"--timeout 20 --target /root/t --index-url {INDEX} {WHEEL_MODULE} "
                        f"&& PYTHONPATH=/root/t python3 -c "
                        f"'import {WHEEL_MODULE}; print({WHEEL_MODULE}.GREETING)'"))
                    seen["pip install s"] = round(time.monotonic() - began, 1)
                    assert done["exit_code"] == 0, done
                    assert done["stdout"].strip() == WHEEL_GREETING, done
                await call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
            await call(s, "rift_task_close", handle=handle)

    run(with_ca, 3 * BOOT_S + 4 * CHORE_S)
    print(f"\nwhat the guests' clients did: {seen}")
    for label in LEGS:
        for name, (status, said) in seen[label].items():
            assert status == 0, (label, name, said)
            if name == "pip download":
                assert "Saved /tmp/dl-" in said and WHEEL_MODULE in said, (label, said)
            else:
                assert said == "hello over inspected TLS\n" + ("\n" if name == "urllib"
                                                               else ""), (label, name, said)
