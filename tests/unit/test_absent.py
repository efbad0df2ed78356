"""What an absent capability answers (rift/services/absent.py): the refusals the
engine gave when it checked for a missing guest shell, runtime or host files, now
given by null objects that `Deps` starts with."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from hypervisor.base import DomainSpec, HypervisorError
from rift.domain.errors import GuestUnreachable, HypervisorFailed, InvalidArgument
from rift.domain.model import Vm
from rift.services.absent import (
    NO_IMAGES,
    NO_RUNTIME,
    NO_SHELL,
    NoHostFiles,
    NoRuntime,
    no_guests,
)
from rift.services.context import GuestRuntime
from rift.services.ports import ExecRead, ExecStart

VM = Vm(id="vm_abcdefgh", task_id="task_abcdefgh", owner="alice", name="x", image="tiny",
        status="running", host="local", vcpus=1, memory_mib=256,
        created_at=datetime(2026, 1, 1, tzinfo=UTC), ssh_host="127.0.0.1", ssh_port=2222)
SPEC = DomainSpec(name="rift-vm_abcdefgh", task_id="task_abcdefgh", vm_id="vm_abcdefgh",
                  vcpus=1, memory_mib=256, image="tiny", domain_type="qemu")


def test_without_guest_access_files_and_execs_are_guest_unreachable() -> None:
    guests = no_guests()
    calls = [
        lambda: guests.files.reachable(VM),
        lambda: guests.files.read_file(VM, "/etc/hostname"),
        lambda: guests.files.write_file(VM, "/tmp/x", b"x", None),
        lambda: guests.files.open_port(VM, 8000, 1.0),
        lambda: guests.execs.reachable(VM),
        lambda: guests.execs.exec_start(VM, ExecStart(exec_id="exec_a", command="true",
                                                      timeout_s=1, cap_bytes=1, wait_ms=0,
                                                      max_bytes=1)),
        lambda: guests.execs.exec_read(VM, ExecRead(exec_id="exec_a", max_bytes=1)),
        lambda: guests.execs.exec_input(VM, "exec_a", b"", eof=True),
        lambda: guests.execs.exec_kill(VM, "exec_a", "TERM"),
    ]
    for call in calls:
        with pytest.raises(GuestUnreachable) as info:
            call()
        assert info.value.code == "guest_unreachable" and NO_SHELL in info.value.message


def test_without_guest_access_there_is_nothing_to_forget_mend_or_close() -> None:
    guests = no_guests()
    assert guests.keys.tidy_keys(lambda task_id: False) == 0
    assert guests.keys.host_key(VM.id) is None
    guests.keys.forget_task(VM.task_id)
    for done in (guests.lifecycle.drop_connections, guests.lifecycle.close_vm):
        done(VM.id)
    guests.lifecycle.resumed(VM, 1.0)
    guests.lifecycle.reconnect(VM, None, 1.0)
    guests.lifecycle.hand_over(VM, VM.task_id, 0.0)
    guests.lifecycle.standby(VM)
    assert guests.lifecycle.forked(VM, "ssh-ed25519 AAAA", "52:54:00:00:00:01", 1.0) == \
        "ssh-ed25519 AAAA"
    guests.lifecycle.close()


def test_without_guest_access_a_start_fails_as_one_without_a_runtime() -> None:
    guests = no_guests()
    with pytest.raises(HypervisorFailed) as planned:
        guests.keys.task_key(VM.task_id)
    with pytest.raises(HypervisorFailed) as waited:
        guests.lifecycle.wait_ready(VM, Path("/nonexistent.log"), 1.0)
    assert NO_RUNTIME in planned.value.message and NO_RUNTIME in waited.value.message
    with pytest.raises(InvalidArgument) as imaged:
        guests.keys.task_key_file(VM.task_id)
    assert imaged.value.details["field"] == "snapshot_id"


def test_without_a_runtime_no_images_are_kept_and_no_folders_are_looked_at() -> None:
    runtime = NoRuntime()
    for field in ("image", "snapshot_id"):
        with pytest.raises(InvalidArgument) as info:
            runtime.images(field)
        assert info.value.details["field"] == field and NO_IMAGES in info.value.message
    assert runtime.image_folder("tiny") is None
    assert runtime.snapshot_folder("snap_abcdefgh") is None
    assert runtime.kept_folders() == [] and runtime.disk_folders() == []
    assert runtime.boot_timeout_s == 60.0


def test_a_real_runtime_answers_its_folders(tmp_path: Path) -> None:
    runtime = GuestRuntime(images_dir=tmp_path / "images", serial_dir=tmp_path / "serial",
                           boot_timeout_s=5, accel=lambda uri: "qemu")
    assert runtime.images("image") == tmp_path / "images"
    assert runtime.image_folder("tiny") == tmp_path / "images" / "tiny"
    assert runtime.snapshot_folder("snap_a") == tmp_path / "snapshots" / "snap_a"
    assert runtime.kept_folders() == [tmp_path / "snapshots", tmp_path / "images"]
    assert runtime.disk_folders() == [tmp_path / "disks"]


def test_without_ssh_to_hosts_nothing_is_put_there_and_no_vm_moves_there() -> None:
    files = NoHostFiles()
    files.prepare("qemu+ssh://elsewhere/system", SPEC)
    files.forget("qemu+ssh://elsewhere/system", VM.id)
    with pytest.raises(HypervisorError, match="no SSH to hosts") as info:
        files.receive("qemu+ssh://elsewhere/system", SPEC, None)
    assert info.value.op == "migrate"
