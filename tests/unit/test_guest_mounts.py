"""The guest side of volumes (rift/guest/mounts.py) over a stand-in for the shell's
commands: what each script is given, and how its ends become refusals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from rift.domain.errors import GuestUnreachable, InvalidArgument
from rift.domain.model import Vm
from rift.guest.errors import GuestError
from rift.guest.execs import ExecResult
from rift.guest.mounts import SshMounts


@dataclass
class Commands:
    answers: list[Any] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    def exec(self, vm: Vm, command: str, stdin: bytes | None, timeout_s: int) -> ExecResult:
        self.ran.append(command)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        code, timed_out, stderr = answer
        return ExecResult(exit_code=code, stdout=b"", stderr=stderr, timed_out=timed_out,
                          truncated=False, duration_ms=5)


@dataclass
class Shell:
    execs: Commands


def _mounts(*answers: Any) -> tuple[SshMounts, Commands]:
    commands = Commands(list(answers))
    return SshMounts(Shell(commands)), commands  # type: ignore[arg-type]


VM = Vm(id="vm_aaaaaaaa", task_id="task_aaaaaaaa", owner="alice", name="v", image="tiny",
        status="running", host="local", vcpus=1, memory_mib=256,
        created_at=datetime(2026, 12, 5, tzinfo=UTC))


def test_a_mount_finds_the_disk_by_its_serial_and_mounts_it_read_only_when_asked() -> None:
    mounts, commands = _mounts((0, False, b""), (0, False, b""))
    mounts.mount(VM, "vol_aaaaaaaa", "/data/my dir", read_only=False)
    mounts.mount(VM, "vol_bbbbbbbb", "/ro", read_only=True)
    first, second = commands.ran
    assert "serial=vol_aaaaaaaa;" in first and "p='/data/my dir';" in first
    assert "opts=rw,noatime;" in first and "resize2fs" in first
    assert "opts=ro,noload;" in second


@pytest.mark.parametrize(("code", "why"), [(3, "did not appear"), (5, "mounted there"),
                                           (6, "could not mount"), (9, "refused")])
def test_a_guest_that_refuses_is_invalid_argument_naming_the_path(code: int, why: str) -> None:
    mounts, _ = _mounts((code, False, b"mount: bad superblock\n"))
    with pytest.raises(InvalidArgument, match=why) as info:
        mounts.mount(VM, "vol_aaaaaaaa", "/data", read_only=False)
    assert info.value.details["field"] == "path"


def test_an_unmount_that_something_holds_says_so_and_a_silent_guest_is_unreachable() -> None:
    mounts, commands = _mounts((7, False, b"umount: can't unmount /data: busy\n"),
                               (None, True, b""), GuestError("connection reset"))
    with pytest.raises(InvalidArgument, match="holds it open"):
        mounts.unmount(VM, "/data")
    assert "sync" in commands.ran[0] and "umount \"$p\"" in commands.ran[0]
    with pytest.raises(GuestUnreachable):
        mounts.unmount(VM, "/data")
    with pytest.raises(GuestUnreachable):
        mounts.mount(VM, "vol_aaaaaaaa", "/data", read_only=True)
