"""How a guest is reached: its SSH over a socket on this machine, or over a channel
through its host's SSH when that host is elsewhere (rift.guest.links); and its
serial console, read here or on its host."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rift.guest.console import TAIL_BYTES
from rift.guest.errors import GuestError
from rift.guest.links import HostLinkError, HostLinks, SshTarget, ssh_target
from rift.guest.ready import Console

log = logging.getLogger("rift.guest.shell")


class Routes:
    """Where each VM's guest is: its host (remembered per VM id), reached directly
    or through `links`; `host_uri` says which URI a host name has (None: a host of
    this machine)."""

    def __init__(self, links: HostLinks | None = None,
                 host_uri: Callable[[str], str | None] | None = None) -> None:
        self.links = links
        self.host_uri = host_uri
        self._lock = threading.Lock()
        self._host_of: dict[str, str] = {}  # vm id -> the name of its host

    def remember(self, vm_id: str, host: str) -> None:
        with self._lock:
            self._host_of[vm_id] = host

    def target(self, vm_id: str) -> SshTarget | None:
        """The SSH of the VM's host when that is elsewhere; None on this machine."""
        with self._lock:
            host = self._host_of.get(vm_id)
        if host is None or self.links is None or self.host_uri is None:
            return None
        uri = self.host_uri(host)
        return ssh_target(uri) if uri is not None else None

    def open(self, vm_id: str, address: tuple[str, int], timeout: float) -> Any:
        """A stream to the guest's SSH: a socket here, or a channel through its host."""
        target = self.target(vm_id)
        if target is not None and self.links is not None:
            try:
                return self.links.channel(target, address[1], timeout)
            except HostLinkError as exc:
                raise GuestError(str(exc), vm_id=vm_id) from exc
        try:
            sock = socket.create_connection(address, timeout=timeout)
        except OSError as exc:
            raise GuestError(f"cannot connect to {address[0]}:{address[1]}: {exc}",
                             vm_id=vm_id) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # else ~40 ms per call
        return sock

    def on_hosts(self, command: str) -> None:
        """Run `command` on each host elsewhere Rift is connected to (the keeper's cut)."""
        if self.links is None:
            return
        for target in self.links.targets():
            try:
                self.links.run(target, command, timeout_s=30.0)
            except HostLinkError as exc:
                log.info("console logs on %s not checked: %s", target.host, exc)

    def console(self, vm_id: str, serial_log: Path) -> Console:
        """The VM's serial console: its file here, or read on its host."""
        target = self.target(vm_id)
        links = self.links
        if target is None or links is None:
            return serial_log

        def read() -> bytes | None:
            try:
                return links.read_tail(target, str(serial_log), TAIL_BYTES)
            except HostLinkError:
                return None

        return read
