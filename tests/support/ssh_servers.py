"""Real paramiko SSH servers on loopback standing in for a guest's sshd, no QEMU:
`LoopbackGuest` accepts any key (counting the logins) and any channel, and a
subclass says how it answers an exec request; `serving` listens on a free port,
serves every connection with it, and closes all on leaving. `vm_at` is the VM
row whose SSH address is such a server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import paramiko

from rift.domain.model import Vm


class LoopbackGuest(paramiko.ServerInterface):
    """Accepts every public key and channel; `logins` counts the logins."""

    logins: int = 0

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return int(paramiko.common.OPEN_SUCCEEDED)

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.logins += 1
        return int(paramiko.common.AUTH_SUCCESSFUL)


@contextmanager
def serving(guest: LoopbackGuest, host_key: paramiko.PKey | None = None) -> Iterator[int]:
    """Serve `guest` on a free loopback port (answered) until the block ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    transports: list[paramiko.Transport] = []
    key = host_key or paramiko.ECDSAKey.generate()

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(key)
            transports.append(transport)
            transport.start_server(server=guest)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for transport in transports:
            transport.close()


def vm_at(port: int, name: str, task_id: str) -> Vm:
    """A running `tiny` VM row of `task_id` whose guest's SSH is 127.0.0.1:`port`."""
    return Vm(id=f"vm_{name}", task_id=task_id, owner="alice", name=name, image="tiny",
              status="running", host="local", vcpus=1, memory_mib=256,
              created_at=datetime.now(UTC), ssh_host="127.0.0.1", ssh_port=port)
