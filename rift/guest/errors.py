"""The guest adapter's one error tree; paramiko and socket errors become these."""

from __future__ import annotations


class GuestError(Exception):
    """The guest could not be reached, or the SSH session failed under a call.

    `.vm_id` names the VM when known. The engine maps it to `guest_unreachable`.
    """

    def __init__(self, message: str, *, vm_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.vm_id = vm_id


class GuestFileError(GuestError):
    """The guest answered, but a file operation failed there: a missing path, a
    directory, no permission, no room. `.path` and `.reason` say which; the
    guest itself is fine (map it to `invalid_argument`, not `guest_unreachable`).
    """

    def __init__(self, path: str, reason: str, *, vm_id: str | None = None) -> None:
        super().__init__(f"{path}: {reason}", vm_id=vm_id)
        self.path = path
        self.reason = reason


class GuestExecError(GuestError):
    """The guest answered, but the exec cannot do what was asked: `.why` is
    `unknown` (no such exec in the guest: it rebooted, or never had it), `ended`
    (input to an exec that ended) or `stdin_closed` (input after its EOF)."""

    def __init__(self, exec_id: str, why: str, *, vm_id: str | None = None) -> None:
        super().__init__(f"exec {exec_id}: {why}", vm_id=vm_id)
        self.exec_id = exec_id
        self.why = why


class GuestPortClosed(GuestError):
    """Nothing in the guest accepted a connection to the port."""

    def __init__(self, port: int, reason: str, *, vm_id: str | None = None) -> None:
        super().__init__(f"nothing listens on port {port} in the guest ({reason})", vm_id=vm_id)
        self.port = port
