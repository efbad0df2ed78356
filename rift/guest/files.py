"""A guest's files and TCP ports over SSH. Files move through `cat` (dropbear has
no SFTP server), so any guest with a POSIX shell serves; they are binary-safe. A
failed file operation in a guest that answered is GuestFileError; a port nothing
listens on is GuestPortClosed."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import paramiko

from rift.domain.model import Vm
from rift.guest.errors import GuestError, GuestFileError, GuestPortClosed
from rift.guest.runner import Runner
from rift.guest.scripts import shell_reason
from rift.guest.steps import absolute, address

_IS_DIRECTORY = 21
_NO_SUCH_FILE = 20


@dataclass(frozen=True, kw_only=True)
class _Transfer:
    """One file operation: its script, its stdin, the most bytes it may answer (the
    file cap unless smaller) and its deadline (the file timeout unless given)."""

    script: str
    data: bytes | None = None
    cap: int | None = None
    timeout_s: float | None = None


class ShellFiles:
    """Files in the guest (`cat` and `head` on a pooled connection) and byte streams
    to its ports (`direct-tcpip` channels on the VM's tunnel connection)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.conns = runner.conns

    def write_file(self, vm: Vm, path: str, data: bytes, mode: int | None) -> int:
        absolute(path, vm)
        quoted = shlex.quote(path)
        script = (f"p={quoted}; if [ -d \"$p\" ]; then echo 'is a directory' >&2; "
                  f"exit {_IS_DIRECTORY}; fi; cat > \"$p\" || exit 1")
        if mode is not None:
            script += f"; chmod {mode & 0o7777:o} \"$p\""
        self._file_op(vm, path, _Transfer(script=script, data=data))
        return len(data)

    def read_file(self, vm: Vm, path: str, *, limit: int | None = None,
                  timeout_s: float | None = None) -> tuple[bytes, bool]:
        absolute(path, vm)
        file_cap = self.conns.settings.file_cap
        cap = file_cap if limit is None else min(limit, file_cap)
        quoted = shlex.quote(path)
        script = (f"p={quoted}; if [ -d \"$p\" ]; then echo 'is a directory' >&2; "
                  f"exit {_IS_DIRECTORY}; fi; if [ ! -e \"$p\" ]; then "
                  f"echo 'no such file' >&2; exit {_NO_SUCH_FILE}; fi; "
                  f"exec head -c {cap + 1} \"$p\"")
        data = self._file_op(vm, path, _Transfer(script=script, cap=cap, timeout_s=timeout_s))
        return data[:cap], len(data) > cap

    def _file_op(self, vm: Vm, path: str, op: _Transfer) -> bytes:
        settings = self.conns.settings
        timeout_s = settings.file_timeout_s if op.timeout_s is None else op.timeout_s
        collected = self.runner.run(vm, op.script, op.data, timeout_s,
                                    (settings.file_cap if op.cap is None else op.cap) + 1)
        if collected.timed_out:
            raise GuestError(f"{path}: the transfer took longer than {timeout_s:.0f}s",
                             vm_id=vm.id)
        if collected.exit_code == 0:
            return collected.stdout
        reason = shell_reason(collected.stderr)
        if collected.exit_code is None:
            raise GuestError(f"{path}: the guest sent no exit status", vm_id=vm.id)
        raise GuestFileError(path, reason or f"failed with exit code {collected.exit_code}",
                             vm_id=vm.id)

    def open_port(self, vm: Vm, port: int, timeout_s: float) -> paramiko.Channel:
        """A byte stream to TCP `port` on the guest's loopback: a `direct-tcpip`
        channel on the VM's tunnel connection, which carries every exposure's
        channels at once (opened on first use, again when it died). GuestError
        when the guest cannot be reached; GuestPortClosed when nothing listens."""
        where = address(vm)
        self.conns.remember(vm)
        for attempt in (1, 2):
            with self.conns.lock:
                transport = self.conns.tunnels.get(vm.id)
            if transport is None or not transport.is_active():
                transport = self.conns.connect(vm.id, where, timeout_s=timeout_s)
                self.conns.keep_tunnel(vm.id, transport)
            try:
                return transport.open_channel("direct-tcpip", ("127.0.0.1", port),
                                              ("127.0.0.1", 0), timeout=timeout_s)
            except paramiko.ChannelException as exc:
                raise GuestPortClosed(port, str(exc), vm_id=vm.id) from exc
            except (paramiko.SSHException, EOFError, OSError) as exc:
                with self.conns.lock:
                    if self.conns.tunnels.get(vm.id) is transport:
                        del self.conns.tunnels[vm.id]
                transport.close()
                if attempt == 2:
                    raise GuestError(f"no channel to port {port}: {exc}", vm_id=vm.id) from exc
        raise AssertionError("unreachable")

