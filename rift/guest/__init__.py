"""Guest access over SSH (paramiko): commands, files and the per-task keys.

`SshGuestShell` holds the parts (files, execs, life) over shared connections;
rift.guest.adapter makes the engine's guest ports of them (`ssh_guests`).
"""

from rift.guest.connections import ShellSettings
from rift.guest.errors import GuestError, GuestFileError
from rift.guest.keys import forget_task, key_for_task
from rift.guest.shell import SshGuestShell

__all__ = [
    "GuestError",
    "GuestFileError",
    "ShellSettings",
    "SshGuestShell",
    "forget_task",
    "key_for_task",
]
