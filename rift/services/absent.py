"""Null objects: what a capability this control plane lacks answers. A control
plane on libvirt's test driver (or the engine's unit tests) has no real guests
and no SSH to hosts; rather than `None` checked where each is used, its ports
refuse the way a missing one always did (or do nothing where nothing was to be
done). rift.bootstrap wires the real ones; `Deps` defaults to these."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from hypervisor.base import DomainSpec, HypervisorError, ImageError
from rift.domain.errors import GuestUnreachable, HypervisorFailed, InvalidArgument
from rift.domain.model import Vm
from rift.services.ports.guest import (
    ExecRead,
    ExecStart,
    GuestExec,
    Guests,
    PortChannel,
    WokenBy,
)
from rift.services.ports.hosts import Overlay

NO_SHELL = "this control plane has no guest access configured"
NO_RUNTIME = "this control plane runs no real guests (no guest runtime)"
NO_IMAGES = ("this control plane runs no real guests (no guest runtime), so it keeps "
             "no images")


class NoGuestFiles:
    """No guest is reached: every call is `guest_unreachable`."""

    def reachable(self, vm: Vm) -> None:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def open_port(self, vm: Vm, port: int, timeout_s: float) -> PortChannel:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def write_file(self, vm: Vm, path: str, data: bytes, mode: int | None) -> int:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def read_file(self, vm: Vm, path: str, *, limit: int | None = None,
                  timeout_s: float | None = None) -> tuple[bytes, bool]:
        raise GuestUnreachable(vm.id, NO_SHELL)


class NoGuestExecs:
    """No guest runs an exec: every call is `guest_unreachable`."""

    def reachable(self, vm: Vm) -> None:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def exec_start(self, vm: Vm, start: ExecStart) -> GuestExec:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def exec_read(self, vm: Vm, read: ExecRead) -> GuestExec:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def exec_input(self, vm: Vm, exec_id: str, data: bytes, *, eof: bool) -> int:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def exec_kill(self, vm: Vm, exec_id: str, signal: Literal["TERM", "KILL"]) -> None:
        raise GuestUnreachable(vm.id, NO_SHELL)

    def exec_resize(self, vm: Vm, exec_id: str, rows: int, cols: int) -> None:
        raise GuestUnreachable(vm.id, NO_SHELL)


class NoGuestKeys:
    """No keys are kept: a plan that needs one fails as a start without a guest
    runtime does, an image cannot be made from a snapshot, nothing is forgotten."""

    def task_key(self, task_id: str) -> str:
        raise HypervisorFailed(NO_RUNTIME)

    def task_key_file(self, task_id: str) -> Path:
        raise InvalidArgument("snapshot_id", NO_IMAGES)

    def forget_task(self, task_id: str) -> None:
        return None

    def tidy_keys(self, needed: Callable[[str], bool]) -> int:
        return 0

    def host_key(self, vm_id: str) -> str | None:
        return None


class NoGuestLifecycle:
    """No guest is connected: a boot wait fails as a start without a guest runtime
    does; a pause, resume, restore, fork or hand-over has no connection to mend."""

    def wait_ready(self, vm: Vm, serial_log: Path, timeout_s: float,
                   markers: bool = True) -> None:
        raise HypervisorFailed(NO_RUNTIME, host=vm.host)

    def standby(self, vm: Vm) -> None:
        return None  # its hand-over has nothing to do either

    def hand_over(self, vm: Vm, task_id: str, now: float) -> None:
        return None

    def reconnect(self, vm: Vm, host_key: str | None, timeout_s: float) -> None:
        return None

    def drop_connections(self, vm_id: str) -> None:
        return None

    def resumed(self, vm: Vm, timeout_s: float, *, woken_by: WokenBy = "call") -> None:
        return None

    def forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
               boot_key: Path | None = None) -> str:
        return host_key or ""  # no identity to give: its source's stays

    def layer_forked(self, vm: Vm, host_key: str | None, mac: str, timeout_s: float,
                     boot_key: Path | None = None) -> str:
        return host_key or ""

    def close_vm(self, vm_id: str) -> None:
        return None

    def close(self) -> None:
        return None


def no_guests() -> Guests:
    """The guest ports of a control plane without real guests."""
    return Guests(files=NoGuestFiles(), execs=NoGuestExecs(), keys=NoGuestKeys(),
                  lifecycle=NoGuestLifecycle())


class NoHostFiles:
    """No SSH to hosts elsewhere: nothing is put there or removed there, and no VM
    moves to one."""

    def prepare(self, uri: str, spec: DomainSpec) -> None:
        return None

    def receive(self, uri: str, spec: DomainSpec, overlay: Overlay | None) -> None:
        raise HypervisorError("migrate", f"{uri} is elsewhere and Rift has no SSH to hosts")

    def forget(self, uri: str, vm_id: str) -> None:
        return None


class NoRuntime:
    """No real guests: no images are kept (refused, naming the field), no snapshot
    or image has files here, no VM disk is sampled; a guest's login after a restore
    would wait the default boot wait."""

    boot_timeout_s = 60.0

    def images(self, field: str) -> Path:
        raise InvalidArgument(field, NO_IMAGES)

    def image_folder(self, image: str) -> Path | None:
        return None

    def snapshot_folder(self, snapshot_id: str) -> Path | None:
        return None

    def kept_folders(self) -> list[Path]:
        return []

    def disk_folders(self) -> list[Path]:
        return []


class NoVolumeFiles:
    """Without real guests no volume has a file: its size is only its row's."""

    def path(self, uri: str, volume_id: str) -> str:
        return f"memory:{volume_id}"

    def make(self, uri: str, volume_id: str, size_gib: int) -> None:
        return None

    def grow(self, uri: str, volume_id: str, size_gib: int) -> None:
        return None

    def clone(self, uri: str, source_id: str, volume_id: str) -> None:
        return None

    def remove(self, uri: str, volume_id: str) -> None:
        return None

    def used_bytes(self, uri: str, volume_id: str) -> int | None:
        return None

    def send(self, uri: str, dest_uri: str, volume_id: str, whole: bool) -> None:
        return None

    def freeze(self, uri: str, volume_id: str, snapshot_id: str) -> None:
        return None

    def frozen(self, uri: str, snapshot_id: str) -> dict[str, int]:
        return {}

    def clone_frozen(self, uri: str, snapshot_id: str, source_id: str,
                     volume_id: str) -> None:
        return None

    def thaw(self, uri: str, snapshot_id: str) -> None:
        return None


class NoVolumeContent:
    """Without real guests no volume has a file to read or write."""

    def _none(self, *args: object, **kwargs: object) -> Any:
        raise ImageError("volumes have no files without real guests")

    list = stat = read = write = make_dir = set_meta = remove = _none


class NoGuestMounts:
    """Without real guests there is no guest to mount a volume in (the test
    driver's domains run none): the disk is plugged, nothing is mounted."""

    def mount(self, vm: Vm, serial: str, path: str, read_only: bool) -> None:
        return None

    def unmount(self, vm: Vm, path: str) -> None:
        return None

    def flush(self, vm: Vm, paths: list[str]) -> None:
        return None
