"""Files in a VM's guest: `rift_vm_write_file` and `rift_vm_read_file`
(commands are rift.services.lifecycle.execs). The engine checks the handle, the VM
and the input; the guest shell port does the SSH."""

from __future__ import annotations

import base64

from rift.contract.base import MAX_PATH
from rift.contract.tools import FileReadOut, FileWrittenOut
from rift.domain.errors import InvalidArgument
from rift.domain.model import Vm
from rift.services.context import Caller, Deps
from rift.services.lifecycle import validate
from rift.services.lifecycle.guest_kinds import reach
from rift.services.lifecycle.leases import (
    check_handle,
    check_running,
    in_write,
    parse_handle,
    task_vm,
)
from rift.services.ports import GuestFiles, Tx


def _guest_vm(deps: Deps, caller: Caller, handle: str | None,
              vm_id: str) -> tuple[Vm, GuestFiles]:
    """The running VM of the handle's task, and the shell that reaches it."""
    parsed = parse_handle(handle)
    validate.vm_id(vm_id)

    def work(tx: Tx) -> Vm:
        return task_vm(tx, check_handle(deps, tx, caller, parsed, deps.clock.now()), vm_id,
                       running=False)

    vm = in_write(deps.store, work)
    # Checked after the write: the handle's check (its activity) stands either way.
    check_running(vm)
    return vm, reach(vm, deps.guests.files)


def _path(path: str) -> str:
    validate.text("path", path, max_len=MAX_PATH)
    if not path.startswith("/"):
        raise InvalidArgument("path", "must be absolute (start with /)")
    return path


def write_file(deps: Deps, caller: Caller, handle: str | None, vm_id: str, path: str,
               content: str, encoding: str | None = None,
               mode: int | None = None) -> FileWrittenOut:
    _path(path)
    data = validate.decoded("content", content, validate.encoding(encoding))
    if mode is not None:
        validate.integer("mode", mode, 0, 0o7777)
    vm, shell = _guest_vm(deps, caller, handle, vm_id)
    return FileWrittenOut(path=path, bytes=shell.write_file(vm, path, data, mode))


def read_file(deps: Deps, caller: Caller, handle: str | None, vm_id: str, path: str,
              encoding: str | None = None) -> FileReadOut:
    _path(path)
    chosen = validate.encoding(encoding)
    vm, shell = _guest_vm(deps, caller, handle, vm_id)
    data, truncated = shell.read_file(vm, path)
    if chosen == "utf-8":
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument("encoding", "the file is not UTF-8 text; read it with "
                                  "encoding base64") from exc
    else:
        content = base64.b64encode(data).decode("ascii")
    return FileReadOut(path=path, content=content, bytes=len(data), truncated=truncated)
