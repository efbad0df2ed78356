"""Guest access over SSH (paramiko): commands, files and the per-task keys.

`SshGuestShell` is the real GuestShell; its `connect_when_ready` waits for a new
guest.
"""

from rift.guest.errors import GuestError, GuestFileError
from rift.guest.keys import forget_task, key_for_task
from rift.guest.shell import SshGuestShell

__all__ = [
    "GuestError",
    "GuestFileError",
    "SshGuestShell",
    "forget_task",
    "key_for_task",
]
