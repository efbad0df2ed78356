"""Guests' console logs bounded on disk and read from their tail (SPEC §15,
`RIFT_CONSOLE_LOG_MIB`): the keeper's cut on real files (ext4 here, tmpfs where
/dev/shm is one), virtlogd's rotated copies removed, the markers read from the tail."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hypervisor.base import DomainSpec
from hypervisor.domain_xml import build_domain_xml
from rift.domain.model import Vm
from rift.guest import GuestError, ShellSettings, SshGuestShell
from rift.guest.console import TAIL_BYTES, ConsoleKeeper, cut, cut_command, read_tail
from rift.guest.ready import read_markers, serial_tail

MIB = 1 << 20


def _appending(path: Path) -> int:
    """A writer like QEMU's (libvirtd's or virtlogd's file, O_APPEND)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def test_a_log_over_the_cap_keeps_its_newest_bytes_and_its_writer_appends_after_them(
        tmp_path: Path) -> None:
    log = tmp_path / "vm_a.log"
    fd = _appending(log)
    try:
        os.write(fd, b"old\n" + os.urandom(5 * MIB) + b"newest line\n")
        assert cut(log, 4 * MIB)
        size = log.stat().st_size
        assert size <= 4 * MIB and read_tail(log, 12) == b"newest line\n"
        os.write(fd, b"after the cut\n")
        assert log.stat().st_size == size + 14  # no hole: the write landed at the new end
        assert read_tail(log, 26) == b"newest line\nafter the cut\n"
        assert not cut(log, 4 * MIB)  # under the cap: left alone
    finally:
        os.close(fd)


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
        yield Path(folder)


def test_a_filesystem_that_cannot_collapse_gets_the_log_emptied(tmpfs_dir: Path) -> None:
    log = tmpfs_dir / "vm_a.log"
    fd = _appending(log)
    try:
        os.write(fd, b"x" * (5 * MIB))
        assert cut(log, 4 * MIB)
        os.write(fd, b"next\n")
        assert log.read_bytes() == b"next\n"
    finally:
        os.close(fd)


def test_the_keeper_cuts_each_log_over_the_cap_and_removes_rotated_copies(
        tmp_path: Path) -> None:
    (tmp_path / "vm_big.log").write_bytes(b"y" * (3 * MIB))
    (tmp_path / "vm_small.log").write_bytes(b"fine\n")
    (tmp_path / "vm_big.log.0").write_bytes(b"z" * MIB)
    (tmp_path / "vm_big.log.12").write_bytes(b"z")
    (tmp_path / "notes.txt").write_bytes(b"q" * (3 * MIB))
    keeper = ConsoleKeeper(tmp_path, 2 * MIB)
    assert keeper.sweep() == 1
    assert (tmp_path / "vm_big.log").stat().st_size <= 2 * MIB
    assert (tmp_path / "vm_small.log").read_bytes() == b"fine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "vm_big.log",
                                                         "vm_small.log"]


def test_the_keepers_thread_holds_a_flooded_log_under_the_cap(tmp_path: Path) -> None:
    log = tmp_path / "vm_flood.log"
    fd = _appending(log)
    keeper = ConsoleKeeper(tmp_path, MIB, interval_s=0.05)
    keeper.start()
    try:
        peak = 0
        for _ in range(60):  # 6 MiB at about 20 MiB/s
            os.write(fd, b"flood\n" * (100 * 1024 // 6))
            peak = max(peak, log.stat().st_size)
            time.sleep(0.005)
        time.sleep(0.2)
        assert log.stat().st_size <= MIB and peak < 3 * MIB
    finally:
        keeper.stop()
        os.close(fd)


def test_the_hosts_elsewhere_command_cuts_and_removes_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "vm_big.log").write_bytes(b"y" * (3 * MIB) + b"end\n")
    (tmp_path / "vm_big.log.0").write_bytes(b"z")
    (tmp_path / "vm_ok.log").write_bytes(b"ok\n")
    subprocess.run(["sh", "-c", cut_command(str(tmp_path), 2 * MIB)], check=True, timeout=30)
    assert (tmp_path / "vm_big.log").stat().st_size <= 2 * MIB
    assert (tmp_path / "vm_big.log").read_bytes().endswith(b"end\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vm_big.log", "vm_ok.log"]


def test_markers_are_read_from_the_tail_of_a_huge_log_in_milliseconds(tmp_path: Path) -> None:
    log = tmp_path / "vm_a.log"
    with log.open("wb") as f:
        f.write(b"RIFT-READY\n")  # an old boot's marker, long gone by the tail
        f.write(b"a" * (20 * MIB))  # no newline: one line of 20 MiB
    began = time.perf_counter()
    assert read_markers(log) == (False, None, None)
    assert len(serial_tail(log)) <= 400
    assert time.perf_counter() - began < 0.1
    with log.open("ab") as f:
        f.write(b"\r\nRIFT-HOSTKEY ssh-ed25519 AAAA root@rift\r\nRIFT-READY\r\n")
    assert read_markers(log) == (True, "ssh-ed25519 AAAA root@rift", None)
    assert len(read_tail(log) or b"") == TAIL_BYTES


def test_the_shell_keeps_its_serial_dir_under_the_cap_once_a_guest_boots(
        tmp_path: Path) -> None:
    serial = tmp_path / "serial"
    serial.mkdir()
    flooded = serial / "vm_other.log"
    flooded.write_bytes(b"x" * (3 * MIB))
    shell = SshGuestShell(tmp_path / "keys", ShellSettings(serial_dir=serial,
                                                        console_cap_bytes=MIB))
    vm = Vm(id="vm_a", task_id="task_a", owner="alice", name="a", image="tiny",
            status="running", host="local", vcpus=1, memory_mib=256,
            created_at=datetime.now(UTC), ssh_host="127.0.0.1", ssh_port=1)
    try:
        with pytest.raises(GuestError):
            shell.life.connect_when_ready(vm, serial / "vm_a.log", 0.05)
        deadline = time.monotonic() + 5
        while flooded.stat().st_size > MIB:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        shell.close()


def test_a_host_elsewhere_that_stalls_holds_up_no_sweep_here(tmp_path: Path) -> None:
    stalled = threading.Event()
    commands: list[str] = []

    def on_hosts(command: str) -> None:
        commands.append(command)
        stalled.wait(10)  # a host whose SSH never answers

    keeper = ConsoleKeeper(tmp_path, MIB, interval_s=0.05, remote=on_hosts,
                           remote_every_s=0.05)
    keeper.start()
    try:
        time.sleep(0.3)
        log = tmp_path / "vm_late.log"
        log.write_bytes(b"x" * (2 * MIB))
        deadline = time.monotonic() + 5
        while log.stat().st_size > MIB:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert len(commands) == 1 and str(tmp_path) in commands[0]  # one at a time
    finally:
        stalled.set()
        keeper.stop()


def test_a_guests_serial_log_is_opened_for_appending_so_it_can_be_cut() -> None:
    xml = build_domain_xml(DomainSpec(name="rift-vm_a", task_id="task_a", vm_id="vm_a",
                                      vcpus=1, memory_mib=256, image="tiny",
                                      domain_type="qemu", kernel="/img/vmlinux",
                                      serial_log="/var/serial/vm_a.log"))
    source = ET.fromstring(xml).find("devices/serial/source")  # noqa: S314 - our own XML
    assert source is not None and source.attrib == {"path": "/var/serial/vm_a.log",
                                                    "append": "on"}
