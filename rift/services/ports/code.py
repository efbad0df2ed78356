"""The guest's code contexts (SPEC §20): rift-code (hypervisor/rift_code.py), a server
in the guest that keeps one kernel per context, reached on the guest's loopback
through the VM's SSH tunnel. One request, one JSON answer; the adapter starts the
server (putting it into the guest first) when nothing listens yet, and bounds what
it reads. What the answer says is the guest's, so hostile: the engine checks its
shape against the contract's models.

A control plane without real guests has `NoGuestCode` (every call
`guest_unreachable`), the way rift.services.absent's null objects answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rift.domain.errors import GuestUnreachable
from rift.domain.model import Vm


@dataclass(frozen=True, kw_only=True)
class CodeRequest:
    """One request to the guest's server: its method, path and JSON body, answered
    within `timeout_s` (a run's own wait is in its body, `wait_ms`)."""

    method: Literal["GET", "POST", "DELETE"]
    path: str
    body: dict[str, Any] | None = None
    timeout_s: float


@dataclass(frozen=True)
class CodeAnswer:
    """The server's HTTP status and its JSON body, as the guest sent it."""

    status: int
    body: Any


class NoPython(Exception):
    """The guest has no python3 to run rift-code: it cannot run code."""


class GuestCode(Protocol):
    def reachable(self, vm: Vm) -> None:
        """`guest_unreachable` at once when this control plane reaches no guest."""
        ...

    def request(self, vm: Vm, request: CodeRequest) -> CodeAnswer:
        """The guest server's answer; GuestUnreachable when the guest cannot be
        reached or answers no HTTP within the time, NoPython when it has no python3."""
        ...

    def start(self, vm: Vm) -> None:
        """Start the server and its default context's kernel, unless it runs (a pool's
        fill: its VMs are handed out with the kernel running); errors as `request`."""
        ...


NO_CODE = "this control plane has no guest access configured"


class NoGuestCode:
    """No guest runs code: every call is `guest_unreachable`."""

    def reachable(self, vm: Vm) -> None:
        raise GuestUnreachable(vm.id, NO_CODE)

    def request(self, vm: Vm, request: CodeRequest) -> CodeAnswer:
        raise GuestUnreachable(vm.id, NO_CODE)

    def start(self, vm: Vm) -> None:
        return None  # nothing to start where no guest is reached
