"""Exec and files: the engine's checks and refusals, over a fake guest shell
(tests/support/fake_guest.py; the SSH adapter has its own tests)."""

from __future__ import annotations

import base64

from hypervisor.fake import FakeHypervisor
from rift.contract import tools as c
from rift.contract.base import command
from rift.services.context import Deps
from rift.services.lifecycle import execs, files, tasks, vms
from tests.support.engine import ALICE, refused
from tests.support.fake_guest import fake_guests
from tests.support.vm_rows import give_ssh_address


def _vm(deps: Deps, ssh: bool = True) -> tuple[str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    if ssh:
        with deps.store.write() as tx:
            give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id


def test_on_a_host_with_no_guest_exec_and_files_refuse_with_guest_unreachable(
        deps: Deps) -> None:
    handle, vm_id = _vm(deps, ssh=False)
    err = refused("guest_unreachable", lambda: execs.start(deps, ALICE, command(c.VmExecIn,
                                           handle=handle, vm_id=vm_id, command="uname")))
    assert "test driver" in err.message and "rift_vm_new" in err.hint
    refused("guest_unreachable", lambda: files.write(deps, ALICE, command(c.VmWriteFileIn,
                                     handle=handle, vm_id=vm_id, path="/x", content="hi")))
    refused("guest_unreachable", lambda: files.read(deps, ALICE, command(c.VmReadFileIn,
                                     handle=handle, vm_id=vm_id, path="/x")))


def test_a_vm_that_is_not_running_refuses_with_its_status(deps: Deps,
                                                          local_hv: FakeHypervisor) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    local_hv.fail_next_create("boom")
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    err = refused("vm_not_running", lambda: execs.start(deps, ALICE, command(c.VmExecIn,
                                        handle=str(opened.handle), vm_id=vm.id, command="true")))
    assert err.details["vm_status"] == "failed" and "rift_vm_new" in err.hint


def test_exec_and_files_go_through_the_guest_shell(make_deps) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    deps = replace(make_deps(), guests=fake_guests())
    handle, vm_id = _vm(deps)
    out = execs.start(deps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, command="cat",
              stdin="hi"))
    assert (out.status, out.exit_code, out.stdout, out.timed_out) == ("exited", 0, "hi", False)
    blob = bytes(range(256))
    wrote = files.write(deps, ALICE, command(
        c.VmWriteFileIn, handle=handle, vm_id=vm_id, path="/tmp/b",
        content=base64.b64encode(blob).decode(), encoding="base64", mode=0o600))
    assert (wrote.path, wrote.bytes) == ("/tmp/b", 256)
    back = files.read(deps, ALICE, command(c.VmReadFileIn, handle=handle, vm_id=vm_id,
               path="/tmp/b", encoding="base64"))
    assert base64.b64decode(back.content) == blob
    refused("invalid_argument", lambda: files.read(deps, ALICE, command(c.VmReadFileIn,
                                    handle=handle, vm_id=vm_id, path="/tmp/b")))


def test_bad_guest_input_is_refused_naming_the_field(deps: Deps) -> None:
    handle, vm_id = _vm(deps)
    for kwargs, field_name in (
        ({"command": ""}, "command"),
        ({"command": "x" * (64 * 1024 + 1)}, "command"),
        ({"command": "true", "timeout_s": 0}, "timeout_s"),
        ({"command": "true", "timeout_s": 24 * 3600 + 1}, "timeout_s"),
        ({"command": "true", "wait_s": -1}, "wait_s"),
        ({"command": "true", "wait_s": 601}, "wait_s"),
    ):
        err = refused("invalid_argument", lambda kwargs=kwargs: execs.start(
            deps, ALICE, command(c.VmExecIn, handle=handle, vm_id=vm_id, **kwargs)))
        assert err.details["field"] == field_name
    err = refused("invalid_argument", lambda: files.write(deps, ALICE, command(c.VmWriteFileIn,
                                          handle=handle, vm_id=vm_id, path="relative/path",
                                          content="x")))
    assert err.details["field"] == "path"
    err = refused("invalid_argument", lambda: files.write(deps, ALICE, command(c.VmWriteFileIn,
                                          handle=handle, vm_id=vm_id, path="/x",
                                          content="not base64!", encoding="base64")))
    assert err.details["field"] == "content"
    refused("invalid_argument", lambda: files.write(deps, ALICE, command(c.VmWriteFileIn,
                                    handle=handle, vm_id=vm_id, path="/x", content="x",
                                    encoding="latin-1")))
    other = tasks.new(deps, ALICE, command(c.TaskNewIn))
    refused("vm_not_found", lambda: execs.start(deps, ALICE, command(c.VmExecIn,
                                handle=str(other.handle), vm_id=vm_id, command="true")))
    refused("handle_required", lambda: execs.start(deps, ALICE, command(c.VmExecIn, handle=None,
                                   vm_id=vm_id, command="true")))
