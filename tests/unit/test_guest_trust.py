"""RIFT_GUEST_CA_FILE (rift.guest.trust): the file's checks, the command that
installs it (run here with /bin/sh in a folder standing for a guest's root), and
when a guest is given it."""

from __future__ import annotations

import datetime
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rift.bootstrap import guest_ca_of
from rift.cli import main
from rift.config import Settings
from rift.domain.errors import InvalidArgument
from rift.domain.model import Vm
from rift.guest.errors import GuestError
from rift.guest.run import Collected
from rift.guest.trust import (
    BEGIN,
    BUNDLE_PATH,
    DIGEST_PATH,
    END,
    GUEST_CA_PATH,
    MAX_BYTES,
    GuestCa,
    GuestCaError,
    GuestTrust,
    install_script,
    load_guest_ca,
)


def _ca_pem(name: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_a_bundle_is_taken_as_its_certificates_once_each_without_the_text_around(
        tmp_path: Path) -> None:
    one, two = _ca_pem("proxy one"), _ca_pem("proxy two")
    path = tmp_path / "bundle.pem"
    path.write_bytes(b"# the office proxy\n" + one + b"\nsome words\n" + two + one)
    ca = load_guest_ca(path)
    assert ca.count == 2 and ca.pem == one + two
    assert len(ca.digest) == 64 and ca.digest == load_guest_ca(path).digest


@pytest.mark.parametrize(("content", "said"), [
    (None, "does not exist"),
    (b"just words, no certificate\n", "holds no PEM certificate"),
    (b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
     "does not parse"),
    (b"x" * (MAX_BYTES + 1), "at most"),
])
def test_a_missing_or_non_pem_file_is_refused_naming_it(
        tmp_path: Path, content: bytes | None, said: str) -> None:
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(GuestCaError) as caught:
        load_guest_ca(path)
    assert str(path) in str(caught.value) and said in str(caught.value)


def test_the_setting_is_refused_as_invalid_argument_naming_it(tmp_path: Path) -> None:
    settings = Settings(guest_ca_file=tmp_path / "nowhere.pem")
    with pytest.raises(InvalidArgument) as caught:
        guest_ca_of(settings)
    assert caught.value.message.startswith("RIFT_GUEST_CA_FILE: ")
    assert guest_ca_of(Settings()) is None
    (tmp_path / "ca.pem").write_bytes(_ca_pem("proxy"))
    found = guest_ca_of(Settings(guest_ca_file=tmp_path / "ca.pem"))
    assert found is not None and found.count == 1


def test_rift_serve_refuses_to_start_with_a_non_pem_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    monkeypatch.setenv("RIFT_GUEST_CA_FILE", str(bad))
    monkeypatch.setenv("RIFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RIFT_HYPERVISOR_URI", "test:///default")
    assert main(["serve", "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert f"RIFT_GUEST_CA_FILE: {bad} holds no PEM certificate" in err, err
    assert not (tmp_path / "data" / "rift.db").exists()  # refused before anything started


def _install(root: Path, ca: GuestCa) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["/bin/sh", "-c", install_script(ca.digest, str(root))],
                          input=ca.pem, capture_output=True, check=False,
                          env={"PATH": os.environ["PATH"]})


def _ca(tmp_path: Path, *names: str) -> GuestCa:
    path = tmp_path / f"{'-'.join(names)}.pem"
    path.write_bytes(b"".join(_ca_pem(name) for name in names))
    return load_guest_ca(path)


def test_the_command_adds_them_to_a_debian_bundle_once_and_names_it_to_pip(
        tmp_path: Path) -> None:
    root = tmp_path / "guest"
    bundle = root / BUNDLE_PATH.lstrip("/")
    bundle.parent.mkdir(parents=True)
    system = _ca_pem("a public root")
    bundle.write_bytes(system)
    first, second = _ca(tmp_path, "proxy"), _ca(tmp_path, "proxy", "other")

    done = _install(root, first)
    assert done.returncode == 0, done.stderr
    assert bundle.read_bytes() == system + f"{BEGIN}\n".encode() + first.pem + f"{END}\n".encode()
    assert (root / GUEST_CA_PATH.lstrip("/")).read_bytes() == first.pem
    assert (root / DIGEST_PATH.lstrip("/")).read_text() == first.digest + "\n"
    assert (root / "etc/pip.conf").read_text() == f"[global]\ncert = {BUNDLE_PATH}\n"
    assert oct((root / GUEST_CA_PATH.lstrip("/")).stat().st_mode & 0o777) == "0o644"

    assert _install(root, first).returncode == 0  # the same again: nothing changes
    assert bundle.read_bytes().count(BEGIN.encode()) == 1

    (root / "etc/pip.conf").write_text("[global]\nindex-url = https://mirror.example/\n")
    done = _install(root, second)  # a new file replaces the block, not doubles it
    assert done.returncode == 0, done.stderr
    assert bundle.read_bytes() == (system + f"{BEGIN}\n".encode() + second.pem
                                   + f"{END}\n".encode())
    assert (root / "etc/pip.conf").read_text().endswith("mirror.example/\n")  # theirs stays


def test_a_guest_without_a_bundle_gets_one_but_no_pip_conf(tmp_path: Path) -> None:
    root = tmp_path / "tiny"
    ca = _ca(tmp_path, "proxy")
    done = _install(root, ca)
    assert done.returncode == 0, done.stderr
    bundle = (root / BUNDLE_PATH.lstrip("/")).read_bytes()
    assert bundle == f"{BEGIN}\n".encode() + ca.pem + f"{END}\n".encode()
    assert not (root / "etc/pip.conf").exists()


@dataclass
class _Runner:
    """Runner.run as GuestTrust uses it: what it was asked, and an answer."""

    exit_code: int = 0
    calls: list[tuple[str, bytes | None]] = field(default_factory=list)

    def run(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: float,
            out_cap: int) -> Collected:
        self.calls.append((vm.id, stdin))
        return Collected(stdout=b"", stderr=b"read-only file system", truncated=False,
                         exit_code=self.exit_code, timed_out=False)


def _vm(vm_id: str) -> Vm:
    return Vm(id=vm_id, task_id="t", owner="u", name=vm_id, image="debian",
              status="creating", host="local", vcpus=1, memory_mib=512,
              created_at=datetime.datetime.now(datetime.UTC))


def test_a_guest_is_given_them_at_its_start_and_a_pooled_one_of_before_at_its_hand_out(
        tmp_path: Path) -> None:
    ca = _ca(tmp_path, "proxy")
    runner = _Runner()
    trust = GuestTrust(runner, ca)  # type: ignore[arg-type]
    trust.install(_vm("vm-a"))
    trust.ensure(_vm("vm-a"))  # this process gave it: no second command
    trust.ensure(_vm("vm-b"))  # pooled before a restart: given now
    assert runner.calls == [("vm-a", ca.pem), ("vm-b", ca.pem)]
    trust.forget("vm-a")
    trust.ensure(_vm("vm-a"))
    assert len(runner.calls) == 3

    none = _Runner()
    unset = GuestTrust(none, None)  # type: ignore[arg-type]
    unset.install(_vm("vm-c"))
    unset.ensure(_vm("vm-c"))
    assert none.calls == []

    refusing = GuestTrust(_Runner(exit_code=1), ca)  # type: ignore[arg-type]
    with pytest.raises(GuestError) as caught:
        refusing.install(_vm("vm-d"))
    assert "RIFT_GUEST_CA_FILE" in caught.value.message
    assert "read-only file system" in caught.value.message
