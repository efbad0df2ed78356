"""hypervisor/guests_cpu.sh (SPEC §15: no guest slows anyone else): the guests'
cgroup `machine` gets a low CPU weight beside libvirtd's own cgroup and virtlogd
joins it, on cgroup v1 and v2, run against folders shaped like /sys/fs/cgroup."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hypervisor" / "guests_cpu.sh"


def fake_chrt(folder: Path) -> Path:
    """A chrt that writes down its arguments (never the real one on the tests' pids)."""
    chrt = folder / "chrt"
    chrt.write_text(f'#!/bin/sh\necho "$*" >> {folder / "chrt.calls"}\n')
    chrt.chmod(0o755)
    return chrt


def run(cgroups: Path, *args: str, virtlogd: str = "41 42") -> str:
    bin_dir = cgroups.parent / f"{cgroups.name}-bin"
    bin_dir.mkdir(exist_ok=True)
    env = {**os.environ, "GUESTS_CPU_ROOT": str(cgroups), "GUESTS_CPU_LIBVIRTD_PID": "",
           "GUESTS_CPU_VIRTLOGD_PIDS": virtlogd, "GUESTS_CPU_CHRT": str(fake_chrt(bin_dir))}
    done = subprocess.run(["sh", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cgroup_v1_gets_shares_of_the_weight_and_virtlogd_in_the_guests_group(
        tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.shares").write_text("1024\n")
    said = run(tmp_path)
    machine = tmp_path / "cpu" / "machine"
    assert (machine / "cpu.shares").read_text() == "102\n"  # 10 * 1024 / 100, as systemd
    assert (machine / "rift-virtlogd" / "cgroup.procs").read_text() == "42\n"  # each written
    # virtlogd weighs as one guest (RIFT_VM_CPU_WEIGHT's default), not cgroup v1's 1024
    assert (machine / "rift-virtlogd" / "cpu.shares").read_text() == "512\n"
    assert (tmp_path / "cpu" / "cpu.shares").read_text() == "1024\n"  # the root untouched
    assert "cpu.shares = 102" in said and "virtlogd (41)" in said and "virtlogd (42)" in said
    # each virtlogd runs as SCHED_BATCH, all its threads: its wakeups preempt no guest
    calls = (tmp_path.parent / f"{tmp_path.name}-bin" / "chrt.calls").read_text()
    assert calls == "-b -a -p 0 41\n-b -a -p 0 42\n"
    assert "virtlogd (42) runs as SCHED_BATCH" in said


def test_cgroup_v2_enables_cpu_and_sets_the_weight(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    machine = tmp_path / "machine"
    machine.mkdir()
    (machine / "cgroup.subtree_control").write_text("cpu\n")
    run(tmp_path, "25", "300", virtlogd="7")
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu\n"  # was off: enabled
    assert (machine / "cgroup.subtree_control").read_text() == "cpu\n"  # was on: left
    assert (machine / "cpu.weight").read_text() == "25\n"
    assert (machine / "rift-virtlogd" / "cpu.weight").read_text() == "300\n"  # as asked
    assert (machine / "rift-virtlogd" / "cgroup.procs").read_text() == "7\n"


def test_a_host_without_a_cpu_controller_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    said = run(tmp_path)
    assert "no cpu cgroup controller" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cgroup.controllers"]


def test_the_guests_group_sits_beside_libvirtds_own(tmp_path: Path) -> None:
    """libvirt makes `machine` under its own placement; the script reads libvirtd's
    /proc/PID/cgroup (here: this test's own process stands for libvirtd)."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.shares").write_text("1024\n")
    own = next((line.split(":", 2)[2] for line in
                Path("/proc/self/cgroup").read_text().splitlines()
                if line.split(":")[1] in ("cpu", "cpu,cpuacct", "cpuacct,cpu")), None)
    if own is None:
        pytest.skip("this machine has no cgroup v1 cpu hierarchy to read a placement from")
    env = {**os.environ, "GUESTS_CPU_ROOT": str(tmp_path), "GUESTS_CPU_CHRT": "false",
           "GUESTS_CPU_LIBVIRTD_PID": str(os.getpid()), "GUESTS_CPU_VIRTLOGD_PIDS": ""}
    subprocess.run(["sh", str(SCRIPT)], env=env, check=True, timeout=30, capture_output=True)
    expected = tmp_path / "cpu" / own.strip("/") / "machine" / "cpu.shares"
    assert expected.read_text() == "102\n"


def test_the_hosts_are_prepared_with_it() -> None:
    """scripts/libvirt.sh (make run, make test) and rift-libvirtd (the hypervisor
    role without systemd) run it; with systemd the role weighs machine.slice."""
    assert 'sh "$GUESTS_CPU"' in (ROOT / "scripts" / "libvirt.sh").read_text()
    role = ROOT / "ansible" / "roles" / "hypervisor"
    assert "/usr/local/sbin/rift-guests-cpu" in (role / "files" / "rift-libvirtd").read_text()
    tasks = (role / "tasks" / "libvirt.yml").read_text()
    assert "CPUWeight={{ hypervisor_guests_cpu_weight }}" in tasks
    assert "hypervisor/guests_cpu.sh" in tasks
