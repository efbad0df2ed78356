"""SSH to hypervisor hosts elsewhere (SPEC §14): what Rift does on a host besides
libvirt's own calls. A `qemu+ssh://user@host[:port]/system?keyfile=…` URI names
the host's SSH; over one connection per host Rift opens `direct-tcpip` channels
to its guests' forwarded SSH ports (on the host's loopback), reads their serial
consoles, and copies there the files a domain needs (kernels, disks), each to
the same absolute path as here and checked by its sha256.

Hosts of other URIs (`qemu:///system`, `test:///…`) are this machine: nothing
here is used for them.
"""

from __future__ import annotations

import getpass
import logging
import os
import pwd
import shlex
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import paramiko

from hypervisor.base import elsewhere
from hypervisor.manifest import sha256_file

log = logging.getLogger("rift.hosts")

CONNECT_TIMEOUT_S = 15.0
CHUNK = 1 << 20


class HostLinkError(Exception):
    """A host's SSH did not let Rift do what it asked; the message says what."""


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int
    user: str
    keyfile: str | None
    verify: bool  # check the host's key against known_hosts (libvirt's no_verify=1: no)


def ssh_target(uri: str) -> SshTarget | None:
    """The SSH a libvirt URI reaches its host by; None for a host on this machine."""
    parsed = urlsplit(uri)
    if not elsewhere(uri) or not parsed.hostname:
        return None
    params = parse_qs(parsed.query)
    keyfile = params.get("keyfile", [None])[0]
    return SshTarget(host=parsed.hostname, port=parsed.port or 22,
                     user=parsed.username or getpass.getuser(), keyfile=keyfile,
                     verify=params.get("no_verify", ["0"])[0] != "1")


def ssh_dir() -> Path:
    """This user's ~/.ssh, from the password database as OpenSSH (and so libvirt's
    qemu+ssh://) finds it, whatever $HOME says (a service started by runuser)."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"


def default_keys() -> list[str]:
    """The keys OpenSSH offers when a URI names no keyfile."""
    return [str(path) for name in ("id_ed25519", "id_ecdsa", "id_rsa")
            if (path := ssh_dir() / name).is_file()]


class HostLinks:
    """One SSH connection per remote host, opened on first use and again when it
    dropped; safe to share between threads (paramiko multiplexes channels)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the dicts below; never held while connecting
        self._connecting: dict[SshTarget, threading.Lock] = {}  # one connect per host at once
        self._clients: dict[SshTarget, paramiko.SSHClient] = {}
        self._copied: dict[tuple[SshTarget, str], str] = {}  # (host, path) -> sha256 there
        self._digests: dict[str, tuple[int, int, str]] = {}  # path -> (size, mtime, sha256)

    def transport(self, target: SshTarget) -> paramiko.Transport:
        """The host's connection, opened when there is none (a host that stalls makes
        only its own callers wait: each host connects under a lock of its own)."""
        with self._lock:
            connecting = self._connecting.setdefault(target, threading.Lock())
        with connecting:
            with self._lock:
                client = self._clients.get(target)
            transport = client.get_transport() if client is not None else None
            if transport is not None and transport.is_active():
                return transport
            if client is not None:
                client.close()
            client = paramiko.SSHClient()
            if target.verify:
                known = ssh_dir() / "known_hosts"
                if known.is_file():
                    client.load_host_keys(str(known))
                client.set_missing_host_key_policy(paramiko.RejectPolicy())
            else:  # as libvirt's no_verify=1: the host's key is not checked
                client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # noqa: S507
            # paramiko takes a list of key files (its type stubs say one)
            keys: Any = [target.keyfile] if target.keyfile else default_keys()
            try:
                sock = socket.create_connection((target.host, target.port),
                                                timeout=CONNECT_TIMEOUT_S)
                # Each guest call is a few small packets through this connection: without
                # NODELAY, Nagle and the delayed ACK add ~40 ms to every round trip.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                client.connect(target.host, target.port, username=target.user,
                               key_filename=keys, look_for_keys=False,
                               allow_agent=False, timeout=CONNECT_TIMEOUT_S, sock=sock,
                               banner_timeout=CONNECT_TIMEOUT_S, auth_timeout=CONNECT_TIMEOUT_S)
            except (OSError, paramiko.SSHException) as exc:
                client.close()
                raise HostLinkError(f"SSH to {target.user}@{target.host}:{target.port} "
                                    f"failed: {exc}") from exc
            with self._lock:
                self._clients[target] = client
            transport = client.get_transport()
            assert transport is not None
            transport.set_keepalive(30)
            return transport

    def targets(self) -> list[SshTarget]:
        """The hosts a connection is open to now."""
        with self._lock:
            return list(self._clients)

    def channel(self, target: SshTarget, port: int, timeout_s: float) -> paramiko.Channel:
        """A `direct-tcpip` channel to 127.0.0.1:`port` on the host (a guest's SSH)."""
        try:
            return self.transport(target).open_channel(
                "direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout_s)
        except (OSError, paramiko.SSHException) as exc:
            raise HostLinkError(f"{target.host} did not open 127.0.0.1:{port} for Rift: "
                                f"{exc}") from exc

    def run(self, target: SshTarget, command: str, timeout_s: float = 120.0) -> str:
        """Run `command` on the host; its stdout, or HostLinkError with its stderr."""
        return self.run_bytes(target, command, timeout_s=timeout_s).decode(errors="replace")

    def run_bytes(self, target: SshTarget, command: str, stdin: bytes = b"",
                  timeout_s: float = 120.0, limit: int | None = None) -> bytes:
        """Run `command` on the host with `stdin`; its stdout (HostLinkError past
        `limit` bytes, or past `timeout_s` on any step), or HostLinkError."""
        name = command.split(maxsplit=1)[0]
        try:
            chan = self.transport(target).open_session(timeout=CONNECT_TIMEOUT_S)
            try:
                chan.settimeout(timeout_s)
                chan.exec_command(command)
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
                out = bytearray()
                while chunk := chan.recv(CHUNK):
                    out += chunk
                    if limit is not None and len(out) > limit:
                        raise HostLinkError(f"{target.host}: {name} answered more than "
                                            f"{limit} bytes")
                if not chan.status_event.wait(timeout_s):
                    raise HostLinkError(f"{target.host}: {name} did not end")
                code = chan.recv_exit_status()
                err = b""
                while chan.recv_stderr_ready():  # its last KiB, for the message below
                    err = (err + chan.recv_stderr(CHUNK))[-1024:]
            finally:
                chan.close()
        except (OSError, paramiko.SSHException) as exc:
            raise HostLinkError(f"{target.host}: {name} failed: {exc}") from exc
        if code != 0:
            raise HostLinkError(f"{target.host}: {name} exited {code}: "
                                f"{err.decode(errors='replace').strip()[-300:]}")
        return bytes(out)

    def read_tail(self, target: SshTarget, path: str, count: int,
                  timeout_s: float = 10.0) -> bytes | None:
        """The last `count` bytes of a file on the host (a guest's console: never
        read whole); None when it is not there (yet)."""
        quoted = shlex.quote(path)
        out = self.run_bytes(target, f"if [ -e {quoted} ]; then tail -c {int(count)} "
                             f"{quoted}; else echo rift-absent >&2; fi",
                             timeout_s=timeout_s, limit=int(count))
        return out or None

    def _put(self, target: SshTarget, local: Path, remote: str) -> None:
        """Copy `local` to `remote` on the host: SFTP, or `cat` without an SFTP subsystem."""
        try:
            sftp = self.transport(target).open_sftp_client()
        except (OSError, paramiko.SSHException):
            sftp = None
        if sftp is not None:
            try:
                sftp.put(str(local), remote, confirm=True)
            finally:
                sftp.close()
            return
        chan = self.transport(target).open_session(timeout=CONNECT_TIMEOUT_S)
        try:
            chan.exec_command(f"cat > {shlex.quote(remote)}")
            with local.open("rb") as f:
                while chunk := f.read(CHUNK):
                    chan.sendall(chunk)
            chan.shutdown_write()
            if chan.recv_exit_status() != 0:
                raise HostLinkError(f"{target.host}: writing {remote} failed")
        finally:
            chan.close()

    def _sha256(self, local: Path) -> str:
        """The file's sha256, computed again only when its size or mtime changed
        (an image's disk is read once, not at every VM that starts from it)."""
        seen = local.stat()
        with self._lock:
            known = self._digests.get(str(local))
        if known is not None and known[:2] == (seen.st_size, seen.st_mtime_ns):
            return known[2]
        digest = sha256_file(local)
        with self._lock:
            self._digests[str(local)] = (seen.st_size, seen.st_mtime_ns, digest)
        return digest

    def mkdir(self, target: SshTarget, path: str) -> None:
        self.run(target, f"mkdir -p {shlex.quote(path)}")

    def ensure_file(self, target: SshTarget, local: Path, *, fresh: bool = False) -> bool:
        """Make the host hold `local`'s bytes at the same path, checked by sha256:
        copied (to a temporary name, then renamed) unless it is there already.
        `fresh`: copy it anyway (a file made for one VM). True when it was copied."""
        path = str(local)
        want = self._sha256(local)
        with self._lock:
            known = self._copied.get((target, path))
        if known == want and not fresh:
            return False
        quoted = shlex.quote(path)
        if not fresh:
            there = self.run(target, f"sha256sum {quoted} 2>/dev/null || true").split()
            if there and there[0] == want:
                with self._lock:
                    self._copied[(target, path)] = want
                return False
        self.mkdir(target, str(local.parent))
        partial = f"{path}.rift-partial"
        try:
            self._put(target, local, partial)
        except (OSError, paramiko.SSHException) as exc:
            raise HostLinkError(f"{target.host}: copying {path} failed: {exc}") from exc
        got = self.run(target, f"sha256sum {shlex.quote(partial)}").split()
        if not got or got[0] != want:
            self.run(target, f"rm -f {shlex.quote(partial)}")
            raise HostLinkError(f"{target.host}: {path} arrived with sha256 "
                                f"{got[0] if got else '?'}, not {want}")
        self.run(target, f"mv -f {shlex.quote(partial)} {quoted}")
        with self._lock:
            self._copied[(target, path)] = want
        log.info("file copied to a host", extra={"host": target.host, "path": path})
        return True

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()
