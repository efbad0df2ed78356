"""Files in a VM's guest: `rift_vm_write_file` and `rift_vm_read_file`
(commands are rift.services.lifecycle.execs). The engine checks the handle and the
VM (the input is its contract's); the guest files port does the SSH."""

from __future__ import annotations

import base64

from rift.contract.base import decoded
from rift.contract.files import FileReadOut, FileWrittenOut, VmReadFileIn, VmWriteFileIn
from rift.domain.errors import InvalidArgument
from rift.domain.model import Vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle.guest_kinds import reach
from rift.services.lifecycle.leases import (
    check_handle,
    check_running,
    in_write,
    parse_handle,
    task_vm,
)
from rift.services.lifecycle.sleeps import awake
from rift.services.ports import GuestFiles, Tx


def _guest_vm(deps: Deps, caller: Caller, handle: str | None,
              vm_id: str) -> tuple[Vm, GuestFiles]:
    """The running VM of the handle's task, and the shell that reaches it."""
    parsed = parse_handle(handle)

    def work(tx: Tx) -> Vm:
        return task_vm(tx, check_handle(deps, tx, caller, parsed, deps.clock.now()), vm_id,
                       running=False)

    def checked() -> Vm:
        vm = in_write(deps.store, work)
        # Checked after the write: the handle's check (its activity) stands either way.
        check_running(vm)
        return vm

    vm = awake(deps, caller.label, checked)  # a sleeping VM is woken (SPEC §17)
    return vm, reach(vm, deps.guests.files)


def write(deps: Deps, caller: Caller, cmd: VmWriteFileIn) -> FileWrittenOut:
    """`rift_vm_write_file`: write a file in a running VM of the handle's task."""
    data = decoded("content", cmd.content, cmd.encoding)
    vm, shell = _guest_vm(deps, caller, cmd.handle, cmd.vm_id)
    return FileWrittenOut(path=cmd.path, bytes=shell.write_file(vm, cmd.path, data, cmd.mode))


def read(deps: Deps, caller: Caller, cmd: VmReadFileIn) -> FileReadOut:
    """`rift_vm_read_file`: read a file in a running VM of the handle's task."""
    path = cmd.path
    vm, shell = _guest_vm(deps, caller, cmd.handle, cmd.vm_id)
    data, truncated = shell.read_file(vm, path)
    if cmd.encoding == "utf-8":
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument("encoding", "the file is not UTF-8 text; read it with "
                                  "encoding base64") from exc
    else:
        content = base64.b64encode(data).decode("ascii")
    return FileReadOut(path=path, content=content, bytes=len(data), truncated=truncated)
