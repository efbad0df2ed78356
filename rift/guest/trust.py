"""The operator's certificate authorities in every guest's trust store
(RIFT_GUEST_CA_FILE, SPEC §19), for networks behind a TLS-inspecting proxy.

`load_guest_ca` reads and checks the file on the control plane (`rift serve`
refuses a missing one, or one with no PEM certificate, naming it). `GuestTrust`
installs it in a guest once its first SSH login succeeds (every boot, a pool's
fills included), with one command over the connection just opened:

- `/usr/local/share/ca-certificates/rift-guest-ca.crt` holds the certificates (so a
  later `update-ca-certificates` in the guest keeps them);
- they are appended, between marker lines, to the system bundle
  `/etc/ssl/certs/ca-certificates.crt`, which OpenSSL (curl, wget, git, apt,
  Python's ssl and urllib) reads; a block from before is replaced, not doubled
  (`update-ca-certificates` would cost seconds under TCG);
- where the guest had that bundle (the Debian family), `/etc/pip.conf` names it
  as pip's `cert` unless the file exists already, for a pip whose own certifi
  would not know the operator's authority (Debian's patched pip reads the system
  bundle; one upgraded from PyPI in a venv does not);
- a guest with `update-ca-trust` (the Red Hat family) gets them as an anchor too.

The guest keeps the digest of what it was given in `/etc/rift/guest-ca.sha256`;
the same digest again costs one `cat`. Forks, snapshots, restores and saved pool
VMs carry the trust store they were saved with. A pooled VM started before this
process (a restart that changed the setting) is brought up to date at its
hand-out, once. An unset setting installs nothing and removes nothing: a VM made
while it was set keeps trusting it.
"""

from __future__ import annotations

import hashlib
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rift.domain.model import Vm
from rift.guest.errors import GuestError
from rift.guest.run import Collected

GUEST_CA_PATH = "/usr/local/share/ca-certificates/rift-guest-ca.crt"
BUNDLE_PATH = "/etc/ssl/certs/ca-certificates.crt"
DIGEST_PATH = "/etc/rift/guest-ca.sha256"
MAX_BYTES = 4 << 20  # a system bundle is about 220 KB
INSTALL_S = 60.0  # one small command; a busy guest under TCG may take seconds
BEGIN, END = "# rift-guest-ca begin", "# rift-guest-ca end"


class GuestCaError(ValueError):
    """RIFT_GUEST_CA_FILE cannot be used; the message says why."""


@dataclass(frozen=True)
class GuestCa:
    """The certificates guests are given: canonical PEM, their count and digest."""

    pem: bytes
    count: int
    digest: str


def load_guest_ca(path: Path) -> GuestCa:
    """The certificates in `path` (PEM, one or more, as a system bundle has them),
    written anew (text around them dropped, duplicates once). GuestCaError when the
    file is missing, unreadable, over MAX_BYTES, or holds no PEM certificate or a
    malformed one."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    where = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise GuestCaError(f"{where} is {size} bytes; at most {MAX_BYTES} are taken")
        data = path.read_bytes()
    except FileNotFoundError:
        raise GuestCaError(f"{where} does not exist") from None
    except OSError as exc:
        raise GuestCaError(f"{where} cannot be read: {exc.strerror or exc}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise GuestCaError(f"{where} holds no PEM certificate "
                           "(-----BEGIN CERTIFICATE----- blocks)")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise GuestCaError(f"{where} holds a certificate that does not parse: {exc}") from None
    blocks: list[bytes] = []
    for cert in certs:
        block = cert.public_bytes(Encoding.PEM)
        if block not in blocks:
            blocks.append(block)
    pem = b"".join(blocks)
    return GuestCa(pem=pem, count=len(blocks), digest=hashlib.sha256(pem).hexdigest())


_INSTALL = r"""set -e
umask 022
l="$r{ca}"; b="$r{bundle}"; d="$r{digest_path}"; p="$r/etc/pip.conf"; a="$r/etc/pki/ca-trust"
[ "$(cat "$d" 2>/dev/null)" != "$RIFT_CA_DIGEST" ] || {{ cat >/dev/null; exit 0; }}
mkdir -p "${{l%/*}}" "${{b%/*}}" "${{d%/*}}"
cat > "$l.rift"; mv -f "$l.rift" "$l"
had=; [ ! -f "$b" ] || had=1
{{ [ -z "$had" ] || sed '/^{begin}$/,/^{end}$/d' "$b"
  echo '{begin}'; cat "$l"; echo '{end}'; }} > "$b.rift"
mv -f "$b.rift" "$b"
if [ -n "$had" ] && [ ! -e "$p" ]; then
  printf '[global]\ncert = %s\n' "{bundle}" > "$p"
fi
if [ -d "$a/source/anchors" ] && command -v update-ca-trust >/dev/null; then
  cp "$l" "$a/source/anchors/rift-guest-ca.crt"
  update-ca-trust extract
fi
echo "$RIFT_CA_DIGEST" > "$d"
"""


def install_script(digest: str, root: str = "") -> str:
    """The command that installs the certificates it reads on stdin (see above), in
    the file system under `root` (the guest's own: empty)."""
    body = _INSTALL.format(digest_path=DIGEST_PATH, ca=GUEST_CA_PATH, bundle=BUNDLE_PATH,
                           begin=BEGIN, end=END)
    return f"RIFT_CA_DIGEST={shlex.quote(digest)} r={shlex.quote(root)}\n{body}"


class Runs(Protocol):
    """What installing needs of rift.guest.runner.Runner: one command run in a guest."""

    def run(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: float,
            out_cap: int) -> Collected: ...


class GuestTrust:
    """Installs `ca` in guests over `runner`, and remembers which VMs of this
    process have it (by VM id, whose files go with the VM)."""

    def __init__(self, runner: Runs, ca: GuestCa | None) -> None:
        self.runner = runner
        self.ca = ca
        self._lock = threading.Lock()
        self._has: dict[str, str] = {}  # vm id -> digest installed by this process

    def install(self, vm: Vm) -> None:
        """Install the certificates in `vm`'s guest (nothing without a CA); GuestError
        when the guest refuses them."""
        ca = self.ca
        if ca is None:
            return
        collected = self.runner.run(vm, install_script(ca.digest), ca.pem, INSTALL_S, 4096)
        if collected.exit_code != 0:
            reason = collected.stderr.decode("utf-8", "replace").strip()[-300:]
            raise GuestError(f"the guest did not take RIFT_GUEST_CA_FILE (exit "
                             f"{collected.exit_code}): {reason}", vm_id=vm.id)
        with self._lock:
            self._has[vm.id] = ca.digest

    def ensure(self, vm: Vm) -> None:
        """Install them unless this process already did (a pooled VM from before a
        restart): one command, a cheap one where the guest has them already."""
        if self.ca is None:
            return
        with self._lock:
            known = self._has.get(vm.id) == self.ca.digest
        if not known:
            self.install(vm)

    def forget(self, vm_id: str) -> None:
        with self._lock:
            self._has.pop(vm_id, None)
