"""A remote host for real: libvirt's own `qemu+ssh://` transport to an sshd this
test starts on a loopback port (its own config, host key and authorized key;
nothing global changes). The local host is drained, so placement sends the VM
over the remote URI; the guest boots, answers exec, and is put away."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypervisor import write_test_host_xml
from hypervisor.base import HypervisorError
from hypervisor.libvirt import LibvirtHypervisor
from hypervisor.tiny import build_tiny
from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.services.lifecycle import execs, tasks, vms
from rift.services.operator import hosts
from tests.support.cache import CACHE as TEST_CACHE
from tests.support.engine import ALICE

ROOT = Path(__file__).resolve().parents[2]
IMAGES = TEST_CACHE / "test-images"
SSHD = "/usr/sbin/sshd"


def _missing() -> str | None:
    if not Path(SSHD).exists():
        return "no sshd (scripts/setup.sh installs openssh-server)"
    if shutil.which("qemu-system-x86_64") is None:
        return "no qemu-system-x86_64 (scripts/libvirt.sh installs it)"
    try:
        LibvirtHypervisor("qemu:///system").info()
    except HypervisorError as err:
        return f"no libvirtd on qemu:///system ({err.message}); scripts/libvirt.sh starts one"
    return None


pytestmark = [pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
              pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def remote_uri(tmp_path: Path) -> Iterator[str]:
    """An sshd on 127.0.0.1:<free port> that lets this test's key in as root."""
    keys = tmp_path / "ssh"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)],
                       check=True)
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    port = _free_port()
    (keys / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        f"PasswordAuthentication no\nStrictModes no\nUsePAM no\nPidFile {keys / 'pid'}\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    sshd = subprocess.Popen([SSHD, "-D", "-f", str(keys / "sshd_config"), "-E",
                             str(keys / "log")])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield (f"qemu+ssh://root@127.0.0.1:{port}/system?keyfile={keys / 'client'}"
               "&no_verify=1&no_tty=1")
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def test_a_vm_placed_on_a_remote_host_boots_and_answers_over_libvirts_ssh_transport(
        tmp_path: Path, remote_uri: str) -> None:
    build_tiny(IMAGES)
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "images" / "tiny").symlink_to(IMAGES / "tiny")
    local = write_test_host_xml(str(tmp_path / "node.xml"), 8, 8192)
    deps = build_deps(Settings(data_dir=data, hypervisor_uri=local))
    try:
        remote = hosts.add_host(deps, "remote", remote_uri)  # size from the remote libvirt
        assert remote.vcpus >= 1 and remote.memory_mib > 0
        hosts.drain_host(deps, "local")
        opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
        vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle), image="tiny",
                 memory_mib=256)).vm
        assert vm.status == "running", vm.error
        assert vm.host == "remote"
        out = execs.start(deps, ALICE, command(c.VmExecIn, handle=str(opened.handle), vm_id=vm.id,
                  command="uname -sr"))
        assert out.exit_code == 0 and out.stdout.startswith("Linux ")
        names = [d.name for d in deps.hosts.hypervisor(remote_uri).list_domains()]
        assert f"rift-{vm.id}" in names
        closed = tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=str(opened.handle)))
        assert closed.destroyed == [vm.id]
        names = [d.name for d in LibvirtHypervisor("qemu:///system").list_domains()]
        assert f"rift-{vm.id}" not in names
        listed = {h["name"]: h for h in hosts.list_hosts(deps)}
        assert listed["remote"]["state"] == "active" and listed["local"]["state"] == "drained"
    finally:
        close_deps(deps)
