"""The guest shell: commands and files in a VM's guest over SSH (paramiko), in
parts that share one set of connections (rift.guest.connections):

- `files` (rift.guest.files): files through `cat` (dropbear has no SFTP server),
  streams to the guest's ports;
- `execs` (rift.guest.execs): commands to their end, and background execs kept by
  rift-exec in the guest;
- `life` (rift.guest.life): the boot wait, a pooled guest's standby shell and
  hand-over, logins after restores and resumes, a fork's identity.

SSH connections are opened on first use and reused by later calls; `close_vm`
closes them when the VM goes. Every paramiko or socket failure becomes
GuestError; a failed file operation in a guest that answered is GuestFileError.
rift.guest.adapter turns these into the engine's guest ports.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rift.guest.connections import Connections, ShellSettings
from rift.guest.console import ConsoleKeeper
from rift.guest.execs import ExecResult, ShellExecs
from rift.guest.files import ShellFiles
from rift.guest.life import ShellLife
from rift.guest.routes import Routes
from rift.guest.runner import Runner
from rift.guest.trust import GuestTrust

__all__ = ["ExecResult", "ShellSettings", "SshGuestShell"]


class SshGuestShell:
    """Guests over SSH, for guests whose root accepts the task's key: the parts
    (`files`, `execs`, `life`) over one set of connections (`conns`). Guests of
    hosts elsewhere are reached through their host's SSH (`routes`); rift-exec
    comes from `helper_binary` for guests without it."""

    def __init__(self, keys_dir: Path, settings: ShellSettings | None = None, *,
                 routes: Routes | None = None,
                 helper_binary: Callable[[], Path] | None = None) -> None:
        settings = settings or ShellSettings()
        routes = routes or Routes()
        self.keys_dir = keys_dir
        self.conns = Connections(keys_dir, settings, routes)
        # keeps the serial logs under the cap, here and on hosts elsewhere (from the
        # first boot)
        self.keeper = (ConsoleKeeper(settings.serial_dir, settings.console_cap_bytes,
                                     remote=routes.on_hosts)
                       if settings.serial_dir is not None and settings.console_cap_bytes
                       else None)
        self.runner = Runner(self.conns, helper_binary)
        self.files = ShellFiles(self.runner)
        self.execs = ShellExecs(self.runner)
        self.trust = GuestTrust(self.runner, settings.guest_ca)
        self.life = ShellLife(self.runner, self.keeper, self.trust)

    def connections(self, vm_id: str) -> int:
        """How many SSH connections to the VM are open now."""
        return self.conns.pool.count(vm_id)

    def close_vm(self, vm_id: str) -> None:
        """Close the VM's connections (calls in flight fail) and forget its host key."""
        self.conns.close_vm(vm_id)
        self.trust.forget(vm_id)

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()
        self.conns.close()
