"""A volume's file put on another host (SPEC §18: `rift host drain --move` of a VM
holding volumes on a host elsewhere; rift.services.operator.volume_moves).

A volume is a qcow2 on its host (`RIFT_DATA_DIR/volumes/<id>.qcow2`) over a chain
of frozen parents (`volumes/parents/<random>.qcow2`, left by clones and snapshots:
read-only, never written again). `send` puts on the destination host, at the same
paths, each frozen parent it lacks (a whole copy: they cannot change meanwhile) and
then the volume's own file: an empty overlay on the same parent, of the same size,
which the live migration fills with the top layer's blocks (QEMU's NBD mirror, in
the migration TLS; `Hypervisor.migrate(copy_volumes=True)`), or, for a volume the
VM only reads (nobody writes it), a whole copy.

Bytes go from host to host through this machine (the control plane's SSH to each;
the hosts need no SSH to one another), streamed, never held whole here. A copy is
written under a temporary name and renamed once its size is checked. Each end is
either a host elsewhere (its SSH) or this machine (`sh` and its files) alike, by
the same shell lines. OSError when a step fails.
"""

from __future__ import annotations

import errno
import shlex
import subprocess
from collections.abc import Iterator

import paramiko

from hypervisor.volumes import VOLUME_TIMEOUT_S
from rift.guest.links import CHUNK, HostLinkError, HostLinks, SshTarget, ssh_target

PARTIAL = ".rift-partial"

# The volume's virtual size, then each file of its chain (the volume's first).
_CHAIN = r"""set -eu
f=$1
[ -e "$f" ] || { echo "no file $f" >&2; exit 1; }
qemu-img info -U "$f" | sed -n 's/^virtual size: .*(\([0-9]*\) bytes).*/\1/p'
qemu-img info -U --backing-chain "$f" | sed -n 's/^image: //p'
"""


class VolumeRelay:
    """Volumes' files carried between hosts, through this machine."""

    def __init__(self, folder: str, links: HostLinks) -> None:
        self.folder = folder  # the volumes' folder, the same path on every host
        self.parents = f"{folder}/parents/"
        self.links = links

    def send(self, source_uri: str, dest_uri: str, file: str, whole: bool) -> None:
        """Put the volume at `file` (on the host at `source_uri`) on the host at
        `dest_uri`: its frozen parents, then a whole copy (`whole`) or an empty
        overlay for a migration to fill. What it made there goes when it fails."""
        size, chain = self._chain(source_uri, file)
        parents = chain[1:]
        made: list[str] = []
        self._sh(dest_uri, f"mkdir -p {shlex.quote(self.parents)}")
        try:
            for parent in reversed(parents):  # the deepest first
                if self._sh(dest_uri, f"[ -e {shlex.quote(parent)} ] && echo there || true"
                            ).strip() != "there":
                    made.append(parent)
                    self._copy(source_uri, dest_uri, parent, mode="444")
            made.append(file)
            if whole:
                self._copy(source_uri, dest_uri, file, mode="644")
            else:
                back = (f"-F qcow2 -b {shlex.quote(parents[0])} " if parents else "")
                self._sh(dest_uri, f"qemu-img create -q -f qcow2 {back}"
                                   f"{shlex.quote(file)} {size}")
        except OSError:
            self._sh(dest_uri, "rm -f " + " ".join(shlex.quote(p) for p in made), check=False)
            raise

    # -- the steps ------------------------------------------------------------------

    def _chain(self, uri: str, file: str) -> tuple[int, list[str]]:
        lines = self._sh(uri, _CHAIN, file).split("\n")
        size, chain = lines[0].strip(), [line for line in lines[1:] if line]
        if not size.isdigit() or not chain or chain[0] != file:
            raise OSError(errno.EIO, f"{file}: no volume's chain there ({lines[:3]})")
        for parent in chain[1:]:  # only frozen parents in the volumes' folder
            if not parent.startswith(self.parents) or "/" in parent[len(self.parents):]:
                raise OSError(errno.EIO, f"{file} reads {parent}, not a frozen parent")
        return int(size), chain

    def _copy(self, source_uri: str, dest_uri: str, path: str, mode: str) -> None:
        partial = path + PARTIAL
        sent = self._write(dest_uri, partial, self._read(source_uri, path))
        q = shlex.quote
        self._sh(dest_uri, f'[ "$(stat -c %s {q(partial)})" = {sent} ] || '
                           f'{{ echo "{path}: {sent} bytes sent, not all arrived" >&2; '
                           f"rm -f {q(partial)}; exit 1; }}\n"
                           f"chmod {mode} {q(partial)}\nmv -f {q(partial)} {q(path)}\n")

    def _sh(self, uri: str, script: str, *args: str, check: bool = True) -> str:
        """`script` run by `sh` on the host at `uri` (this machine's own for a host
        here), with `args`; its stdout (OSError when it fails and `check`)."""
        target = ssh_target(uri)
        if target is None:
            done = subprocess.run(["sh", "-c", script, "sh", *args],  # noqa: S603,S607
                                  capture_output=True,
                                  text=True, timeout=VOLUME_TIMEOUT_S, check=False)
            if done.returncode != 0 and check:
                raise OSError(errno.EIO, f"here: {done.stderr.strip()[-300:]}")
            return done.stdout
        command = " ".join(shlex.quote(a) for a in ("sh", "-c", script, "sh", *args))
        try:
            return self.links.run(target, command, timeout_s=VOLUME_TIMEOUT_S)
        except HostLinkError as exc:
            if not check:
                return ""
            raise OSError(errno.EIO, f"{target.host}: {exc}") from exc

    def _command(self, target: SshTarget, command: str) -> paramiko.Channel:
        """A channel of the host's SSH running `command`, its steps bounded by
        VOLUME_TIMEOUT_S (OSError when it cannot be opened or started)."""
        try:
            chan = self.links.transport(target).open_session(timeout=VOLUME_TIMEOUT_S)
        except (HostLinkError, OSError, paramiko.SSHException) as exc:
            raise OSError(errno.EIO, f"{target.host}: {exc}") from exc
        try:
            chan.settimeout(VOLUME_TIMEOUT_S)
            chan.exec_command(command)
        except (OSError, paramiko.SSHException) as exc:
            chan.close()
            raise OSError(errno.EIO, f"{target.host}: {command}: {exc}") from exc
        return chan

    def _read(self, uri: str, path: str) -> Iterator[bytes]:
        """The file's bytes, in chunks (OSError when the read fails midway)."""
        target = ssh_target(uri)
        if target is None:
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
            return
        chan = self._command(target, f"cat {shlex.quote(path)}")
        try:
            chan.shutdown_write()
            while chunk := chan.recv(CHUNK):
                yield chunk
            if chan.recv_exit_status() != 0:
                raise OSError(errno.EIO, f"{target.host}: reading {path} failed")
        finally:
            chan.close()

    def _write(self, uri: str, path: str, chunks: Iterator[bytes]) -> int:
        """Write `chunks` to a new file at `path` on the host; answers its size."""
        sent = 0
        target = ssh_target(uri)
        if target is None:
            with open(path, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    sent += len(chunk)
            return sent
        chan = self._command(target, f"cat > {shlex.quote(path)}")
        try:
            for chunk in chunks:
                chan.sendall(chunk)
                sent += len(chunk)
            chan.shutdown_write()
            if chan.recv_exit_status() != 0:
                raise OSError(errno.EIO, f"{target.host}: writing {path} failed")
        except paramiko.SSHException as exc:
            raise OSError(errno.EIO, f"{target.host}: writing {path} failed: {exc}") from exc
        finally:
            chan.close()
        return sent
