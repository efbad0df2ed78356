"""Real guests: the `tiny` image built from Debian packages, booted by libvirt
under QEMU (TCG), reached over SSH by the paramiko adapter.

Needs qemu-system-x86_64 and a libvirtd answering on qemu:///system
(scripts/libvirt.sh installs and starts both; `make test` runs it first).
The image is cached between runs in var/cache/test-images (the build is
skipped when its inputs have not changed).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import libvirt
import pytest

from hypervisor.base import GuestDomain, HypervisorError
from hypervisor.domain_xml import parse_rift_mark
from hypervisor.exec_helper import GUEST_PATH
from hypervisor.image_files import ImageFiles, image_files
from hypervisor.kernel_boot import guest_spec
from hypervisor.kvm import KVM, TCG, probe_accel
from hypervisor.libvirt import LibvirtHypervisor
from hypervisor.tiny import build_tiny
from rift.domain.model import Vm
from rift.guest import GuestError, GuestFileError, ShellSettings, SshGuestShell, key_for_task
from rift.guest.errors import GuestExecError
from rift.services.ports import ExecRead, ExecStart, GuestExec
from tests.support.cache import CACHE as TEST_CACHE

URI = "qemu:///system"
ROOT = Path(__file__).resolve().parents[2]
IMAGES = TEST_CACHE / "test-images"
BOOT_TIMEOUT_S = 60
MANAGED_SAVE_DIR = Path("/var/lib/libvirt/qemu/save")  # qemu:///system's managed save images


def _prerequisites() -> str | None:
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (scripts/libvirt.sh installs it)"
    hv = LibvirtHypervisor(URI)
    try:
        hv.info()
    except HypervisorError as err:
        return f"no libvirtd answers on {URI} ({err.message}); scripts/libvirt.sh starts one"
    finally:
        hv.close()
    return None


_MISSING = _prerequisites()
pytestmark = [
    pytest.mark.skipif(_MISSING is not None, reason=_MISSING or ""),
    pytest.mark.slow,
]


@dataclass
class Guest:
    vm: Vm
    shell: SshGuestShell
    hv: LibvirtHypervisor
    serial_log: Path
    boot_s: float
    domain: str


@pytest.fixture(scope="module")
def image() -> ImageFiles:
    build_tiny(IMAGES)
    return image_files(IMAGES, "tiny")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _boot(image: ImageFiles, work: Path, name: str) -> Guest:
    task_id, vm_id = f"task_{name}", f"vm_{name}"
    keys = work / "keys"
    _, public = key_for_task(keys, task_id)
    port = _free_port()
    serial = work / f"{vm_id}.serial.log"
    spec = guest_spec(image, GuestDomain(
        name=f"rift-test-{vm_id}", task_id=task_id, vm_id=vm_id, vcpus=1, memory_mib=256,
        domain_type=TCG, ssh_port=port, serial_log=serial), public)
    vm = Vm(id=vm_id, task_id=task_id, owner="alice", name=name, image="tiny", status="running",
            host="local", vcpus=1, memory_mib=256, created_at=datetime.now(UTC),
            ssh_host="127.0.0.1", ssh_port=port)
    hv = LibvirtHypervisor(URI)
    shell = SshGuestShell(keys)
    started = time.monotonic()
    hv.destroy(spec.name)  # a leftover of an interrupted run
    hv.create(spec)
    try:
        shell.life.connect_when_ready(vm, serial, BOOT_TIMEOUT_S)
    except BaseException:
        hv.destroy(spec.name)
        shell.close()
        hv.close()
        raise
    return Guest(vm, shell, hv, serial, time.monotonic() - started, spec.name)


def _listed(name: str) -> bool:
    out = subprocess.run(["virsh", "-c", URI, "list", "--all", "--name"], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return name in out.split()


@pytest.fixture(scope="module")
def guest(image: ImageFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    booted = _boot(image, tmp_path_factory.mktemp("guest"), "k3v9x2m7")
    yield booted
    booted.shell.close()
    booted.hv.destroy(booted.domain)
    booted.hv.close()


def test_a_guest_boots_from_the_tiny_image_and_runs_a_command(guest: Guest) -> None:
    assert guest.boot_s < BOOT_TIMEOUT_S
    result = guest.shell.execs.exec(guest.vm, "uname -a", None, 30)
    assert result.exit_code == 0 and not result.timed_out and not result.truncated
    assert result.stdout.startswith(b"Linux ")
    assert result.stderr == b""


def test_stdin_reaches_the_command_and_stderr_and_exit_code_come_back(guest: Guest) -> None:
    data = bytes(range(256)) * 1000
    result = guest.shell.execs.exec(guest.vm, "cat; echo 'to stderr' >&2; exit 3", data, 30)
    assert (result.exit_code, result.stdout, result.stderr) == (3, data, b"to stderr\n")


def test_a_command_that_never_ends_is_killed_at_its_timeout(guest: Guest) -> None:
    started = time.monotonic()
    result = guest.shell.execs.exec(guest.vm, "echo begun; sleep 1000 | cat", None, 2)
    assert result.timed_out and result.exit_code is None
    assert result.stdout == b"begun\n"
    assert 2 <= time.monotonic() - started < 8
    left = guest.shell.execs.exec(guest.vm, "ps -o args", None, 30).stdout.decode()
    assert "sleep 1000" not in left


def test_big_output_is_capped_and_said_to_be_truncated(guest: Guest) -> None:
    started = time.monotonic()
    result = guest.shell.execs.exec(guest.vm, "head -c 3000000 /dev/zero; echo done >&2", None, 60)
    assert result.truncated and not result.timed_out and result.exit_code == 0
    assert result.stdout == b"\0" * guest.shell.conns.settings.output_cap
    assert result.stderr == b"done\n"
    assert time.monotonic() - started < 30


def test_a_ten_mib_binary_file_goes_in_and_comes_back_unchanged(guest: Guest) -> None:
    data = os.urandom(10 * 1024 * 1024)
    assert guest.shell.files.write_file(guest.vm, "/root/blob.bin", data, 0o640) == len(data)
    check = guest.shell.execs.exec(guest.vm, "sha256sum /root/blob.bin; stat -c %a /root/blob.bin",
                             None, 60)
    digest, _, mode = check.stdout.decode().partition("  /root/blob.bin\n")
    assert digest == hashlib.sha256(data).hexdigest() and mode.strip() == "640"
    back, truncated = guest.shell.files.read_file(guest.vm, "/root/blob.bin")
    assert not truncated and hashlib.sha256(back).digest() == hashlib.sha256(data).digest()


def test_missing_paths_and_directories_are_clear_file_errors(guest: Guest) -> None:
    with pytest.raises(GuestFileError, match="no such file"):
        guest.shell.files.read_file(guest.vm, "/no/such/file")
    with pytest.raises(GuestFileError, match="is a directory"):
        guest.shell.files.read_file(guest.vm, "/root")
    with pytest.raises(GuestFileError, match="nonexistent directory"):
        guest.shell.files.write_file(guest.vm, "/no/such/dir/file", b"x", None)


def test_one_connection_serves_calls_from_many_threads(guest: Guest) -> None:
    results: list[bytes] = []
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            results.append(guest.shell.execs.exec(guest.vm, f"echo {i}", None, 30).stdout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(results) == sorted(f"{i}\n".encode() for i in range(8))


def _exec_ended(shell: SshGuestShell, vm: Vm, exec_id: str) -> GuestExec:
    deadline = time.monotonic() + 60
    while True:
        view = shell.execs.exec_read(vm, ExecRead(exec_id=exec_id, max_bytes=1 << 20,
                                                   wait_ms=2000))
        if view.state != "running":
            return view
        assert time.monotonic() < deadline, view


def test_a_background_exec_outlives_its_call_and_the_shell_that_started_it(
        guest: Guest) -> None:
    """rift-exec in the guest: started with no wait, read by a long poll, and read
    to its end by a second shell (a restarted Rift), with its own connections."""
    started = guest.shell.execs.exec_start(guest.vm, ExecStart(
        exec_id="exec_bg000001", command="echo first; sleep 2; echo second >&2; exit 7",
        timeout_s=60, cap_bytes=1 << 20, wait_ms=0, max_bytes=1 << 20))
    assert started.state == "running" and started.exit_code is None
    # The channel closed with its keeper running: the connection serves other calls.
    assert guest.shell.execs.exec(guest.vm, "echo meanwhile", None, 30).stdout == b"meanwhile\n"
    first = guest.shell.execs.exec_read(guest.vm, ExecRead(
        exec_id="exec_bg000001", max_bytes=1 << 20, wait_ms=10000))
    assert first.stdout == b"first\n"
    other = SshGuestShell(guest.shell.keys_dir)
    try:
        ended = _exec_ended(other, guest.vm, "exec_bg000001")
    finally:
        other.close()
    assert (ended.state, ended.exit_code, ended.stdout, ended.stderr) == \
        ("ended", 7, b"first\n", b"second\n")


# what a rift-exec from before `--clock` answers it (an image built before it)
_OLDER_HELPER = f"""#!/bin/sh
case " $* " in *" --clock="*) exit 2;; esac
exec {GUEST_PATH}.real "$@"
"""


def test_a_clock_owed_since_a_wake_is_set_by_the_helper_or_before_an_older_one(
        guest: Guest) -> None:
    """The exec after a wake sets the guest's clock in the helper (`--clock`), and
    with `date -s` before it when the guest's helper is older and refuses the flag."""
    shell, vm = guest.shell, guest.vm

    def started_clock(exec_id: str) -> int:
        assert shell.execs.exec(vm, "date -s @1000000000 >/dev/null", None, 30).exit_code == 0
        shell.conns.owe_clock(vm.id)  # as a wake by an exec leaves it
        view = shell.execs.exec_start(vm, ExecStart(
            exec_id=exec_id, command="date +%s", timeout_s=30, cap_bytes=4096,
            wait_ms=10000, max_bytes=4096))
        assert (view.state, view.exit_code) == ("ended", 0), view
        return int(view.stdout)

    assert abs(started_clock("exec_clock0001") - time.time()) <= 2
    # the guest's own helper takes the flag (so the start above set the clock itself)
    direct = shell.execs.exec(vm, f"date -s @1000000000 >/dev/null; {GUEST_PATH} start "
                              f"/run/rift-exec/exec_clock0000 30 4096 10000 4096 "
                              f"--clock={round(time.time() * 100)} -- 'date +%s'", None, 30)
    assert direct.exit_code == 0 and abs(int(direct.stdout.split()[-1]) - time.time()) <= 2
    swap = (f"mv {GUEST_PATH} {GUEST_PATH}.real && cat > {GUEST_PATH} "
            f"&& chmod 755 {GUEST_PATH}")
    assert shell.execs.exec(vm, swap, _OLDER_HELPER.encode(), 30).exit_code == 0
    try:
        assert abs(started_clock("exec_clock0002") - time.time()) <= 2
    finally:
        shell.execs.exec(vm, f"mv -f {GUEST_PATH}.real {GUEST_PATH}", None, 30)
    assert vm.id not in shell.conns.clock_owed


def test_a_background_exec_takes_input_and_its_kill_leaves_no_process(guest: Guest) -> None:
    shell, vm = guest.shell, guest.vm
    shell.execs.exec_start(vm, ExecStart(exec_id="exec_in000001",
                                         command="read line; echo got-$line", timeout_s=60,
                                         cap_bytes=4096, wait_ms=0, max_bytes=4096))
    assert shell.execs.exec_input(vm, "exec_in000001", b"hello\n", eof=True) == 6
    assert _exec_ended(shell, vm, "exec_in000001").stdout == b"got-hello\n"
    with pytest.raises(GuestExecError) as ended:
        shell.execs.exec_input(vm, "exec_in000001", b"late", eof=False)
    assert ended.value.why == "ended"
    shell.execs.exec_start(vm, ExecStart(
        exec_id="exec_kl000001", command="sh -c 'trap \"\" TERM; sleep 600' & sleep 600",
        timeout_s=600, cap_bytes=4096, wait_ms=500, max_bytes=4096))
    shell.execs.exec_kill(vm, "exec_kl000001", "TERM")
    killed = _exec_ended(shell, vm, "exec_kl000001")
    assert killed.killed and killed.signal == 15
    left = shell.execs.exec(vm, "ps -o pid,args | grep 'sleep 60[0]' || true", None, 30)
    assert left.stdout == b"", left.stdout  # the TERM-ignoring child got KILL too
    with pytest.raises(GuestExecError) as unknown:
        shell.execs.exec_read(vm, ExecRead(exec_id="exec_none0001", max_bytes=10))
    assert unknown.value.why == "unknown"


def test_a_destroyed_guest_is_gone_and_a_call_in_flight_fails_fast(
    image: ImageFiles, tmp_path: Path
) -> None:
    booted = _boot(image, tmp_path, "d3stroy0")
    name = booted.domain
    try:
        assert booted.shell.execs.exec(booted.vm, "true", None, 30).exit_code == 0
        outcome: list[BaseException | object] = []

        def long_call() -> None:
            try:
                outcome.append(booted.shell.execs.exec(booted.vm, "sleep 60", None, 120))
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=long_call)
        caller.start()
        time.sleep(0.5)
        started = time.monotonic()
        assert booted.hv.destroy(name)
        caller.join(30)
        assert not caller.is_alive() and time.monotonic() - started < 30
        assert isinstance(outcome[0], GuestError)
        assert not _listed(name)
        with pytest.raises(GuestError):
            booted.shell.execs.exec(booted.vm, "true", None, 5)
    finally:
        booted.hv.destroy(name)
        booted.shell.close()
        booted.hv.close()


def _exec_when_back(guest: Guest, timeout_s: float) -> tuple[float, bytes]:
    """Seconds until an exec answers again (the old connection died with QEMU), and its output."""
    started = time.monotonic()
    while True:
        try:
            result = guest.shell.execs.exec(guest.vm, "cat /root/before-save", None, 10)
            return time.monotonic() - started, result.stdout
        except GuestError:
            if time.monotonic() - started > timeout_s:
                raise
            time.sleep(0.05)


def test_a_managed_saved_guest_restores_where_it_was_and_answers_ssh_again(
    image: ImageFiles, tmp_path: Path
) -> None:
    booted = _boot(image, tmp_path, "s4ved000")
    name, hv = booted.domain, booted.hv
    image_file = MANAGED_SAVE_DIR / f"{name}.save"
    try:
        wrote = booted.shell.execs.exec(booted.vm, "echo kept > /root/before-save", None, 30)
        assert wrote.exit_code == 0
        started = time.monotonic()
        hv.save(name)
        save_s = time.monotonic() - started
        saved_mib = image_file.stat().st_size / 2**20
        listed = {r.name: r for r in hv.list_domains()}[name]
        assert (listed.active, listed.saved) == (False, True)
        hv.set_owner(name, "task_handed")  # the save image's own XML too, which restore runs
        started = time.monotonic()
        hv.restore(name)
        restore_s = time.monotonic() - started
        answer_s, out = _exec_when_back(booted, 30)
        assert out == b"kept\n"  # the tmpfs in memory came back: a restore, not a boot
        assert not image_file.exists()  # libvirt drops the image once the domain runs
        listed = {r.name: r for r in hv.list_domains()}[name]
        assert (listed.active, listed.saved, listed.task_id) == (True, False, "task_handed")
        hv.set_owner(name, "task_again")  # live and persistent at once
        conn = libvirt.open(URI)
        try:
            dom = conn.lookupByName(name)
            marks = {parse_rift_mark(dom.XMLDesc(f))[0]
                     for f in (0, libvirt.VIR_DOMAIN_XML_INACTIVE)}
        finally:
            conn.close()
        assert marks == {"task_again"}
        hv.save(name)
        assert image_file.exists()
        assert hv.destroy(name)
        assert not image_file.exists() and not _listed(name)
        print(f"\ntiny 256 MiB under TCG: boot to exec {booted.boot_s:.2f} s, managed save "
              f"{save_s:.2f} s ({saved_mib:.0f} MiB image), restore {restore_s:.2f} s, "
              f"restore to exec {restore_s + answer_s:.2f} s")
    finally:
        hv.destroy(name)
        booted.shell.close()
        hv.close()


def test_the_accelerator_probe_boots_a_guest_and_caches_its_verdict(
    image: ImageFiles, tmp_path: Path
) -> None:
    cache = tmp_path / "accel.json"
    accel, why = probe_accel(image, URI, cache_file=cache)
    assert accel in (KVM, TCG) and why
    if os.path.exists("/dev/kvm"):
        assert cache.exists()
        started = time.monotonic()
        assert probe_accel(image, URI, cache_file=cache) == (accel, why)
        assert time.monotonic() - started < 1
    listed = subprocess.run(["virsh", "-c", URI, "list", "--all", "--name"], capture_output=True,
                            text=True, check=True, timeout=30).stdout
    assert "rift-probe-" not in listed


def test_a_hostile_helper_costs_its_own_calls_their_deadline_and_nothing_else(
    image: ImageFiles, guest: Guest
) -> None:
    """SPEC §15 on a real guest: a fake rift-exec that never reads its stdin makes
    an exec with stdin and an input fail with GuestError at their deadlines (not
    pin their threads for good), one that floods fails at once past the view's
    size, and another VM's execs on the same shell answer meanwhile."""
    hostile = _boot(image, guest.shell.keys_dir.parent, "h0st1le0")
    shell = SshGuestShell(guest.shell.keys_dir,
                          ShellSettings(file_timeout_s=5.0, helper_slack_s=5.0))
    try:
        def fake_helper(script: str) -> None:
            put = shell.execs.exec(hostile.vm, f"printf %s {shlex.quote(script)} > {GUEST_PATH}.x "
                             f"&& chmod 755 {GUEST_PATH}.x && mv -f {GUEST_PATH}.x "
                             f"{GUEST_PATH}", None, 30)
            assert put.exit_code == 0, put.stderr

        fake_helper("#!/bin/sh\nexec sleep 100000\n")
        stdin = b"x" * (8 << 20)  # far past the guest's SSH window: the send must wait
        outcome: dict[str, tuple[float, BaseException | None]] = {}

        def stalled(name: str, call: Callable[[], object]) -> None:
            began = time.monotonic()
            try:
                call()
                outcome[name] = (time.monotonic() - began, None)
            except BaseException as exc:
                outcome[name] = (time.monotonic() - began, exc)

        calls = {
            "start": lambda: shell.execs.exec_start(hostile.vm, ExecStart(
                exec_id="exec_stuck001", command="cat", stdin=stdin, timeout_s=60,
                cap_bytes=4096, wait_ms=0, max_bytes=4096)),
            "input": lambda: shell.execs.exec_input(hostile.vm, "exec_stuck002", stdin, eof=True),
        }
        threads = [threading.Thread(target=stalled, args=item) for item in calls.items()]
        for thread in threads:
            thread.start()
        other: list[float] = []
        until = time.monotonic() + 60
        while any(thread.is_alive() for thread in threads):
            assert time.monotonic() < until, "a stalled call was never ended"
            began = time.monotonic()
            assert shell.execs.exec(guest.vm, "echo ok", None, 30).stdout == b"ok\n"
            other.append(time.monotonic() - began)
            time.sleep(0.2)
        for thread in threads:
            thread.join(60)
        # exec_start waits its `wait_ms` (0) plus the helper's slack (5 s here); input
        # the shell's file timeout (5 s); each with a second's grace
        assert isinstance(outcome["start"][1], GuestError), outcome
        assert 4.5 <= outcome["start"][0] < 8, outcome
        assert isinstance(outcome["input"][1], GuestError), outcome
        assert 4.5 <= outcome["input"][0] < 8, outcome
        assert len(other) >= 5 and max(other) < 3.0, other

        fake_helper("#!/bin/sh\nexec yes\n")
        began = time.monotonic()
        with pytest.raises(GuestError, match="more than"):
            shell.execs.exec_read(hostile.vm, ExecRead(exec_id="exec_flood01", max_bytes=4096))
        assert time.monotonic() - began < 5
        # a view line made for backtracking patterns (it froze the whole process once)
        fake_helper("#!/bin/sh\nprintf 'rift-exec " + "a=" * 60 + "'\n")
        began = time.monotonic()
        with pytest.raises(GuestError, match="no view"):
            shell.execs.exec_read(hostile.vm, ExecRead(exec_id="exec_catas01", max_bytes=4096))
        assert time.monotonic() - began < 5
        # the hostile VM's own calls work again on a fresh connection
        assert shell.execs.exec(hostile.vm, "echo back", None, 30).stdout == b"back\n"
        print(f"\nhostile helper: start failed after {outcome['start'][0]:.1f} s, input after "
              f"{outcome['input'][0]:.1f} s; the other VM's {len(other)} execs meanwhile "
              f"took at most {max(other) * 1000:.0f} ms")
    finally:
        shell.close()
        hostile.shell.close()
        hostile.hv.destroy(hostile.domain)
        hostile.hv.close()
