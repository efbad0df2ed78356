"""A guest with a disk moves between hosts elsewhere over libvirt's migration TLS
(SPEC §14-§15, issue #26), on two hosts made by scripts/netns-hosts.sh (hv11 and
hv12, each with its own /etc/pki/qemu: a server and a client certificate signed
by the hosts' CA) and a stranger beside them (rift-hv13: a network namespace
only, at 10.214.13.2, no host of the fleet).

What is checked: `rift host drain hv11 --move` refuses to move a `debian` VM
while hv11's client certificate is another CA's (hv12's QEMU refuses the TLS
handshake) and, in make soak, while hv11 has no certificate at all, and each time
the VM runs on hv11 as before; with hv11's own certificates it moves to hv12,
its counter exec counting on and the file written on its disk read back there
from the disk; the stream went to hv12's migration ports; those ports answer
hv11 but not the stranger
(hv12's fleet set, the drop counted as `migration_refused`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.real_guests import RealSettings
from tests.support.servers import COUNTER, Server, wait_until
from tests.support.soak import SOAK, long_form

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "netns-hosts.sh"
FIRST, SECOND, STRANGER = 11, 12, 13  # hv11 and hv12 at 10.214.N.2; rift-hv13 a stranger
# hv11 with no certificate at all is make soak's (a refusal costs a try of the move)
REFUSALS = ("no certificate", "another CA's certificate") if SOAK else (
    "another CA's certificate",)
PROBE_PORT = 49200  # one of libvirt's migration ports (49152-49215)
WATCH = """table inet rift_test_tls
delete table inet rift_test_tls
table inet rift_test_tls {
	counter streamed {
	}
	chain input {
		type filter hook input priority -10; policy accept;
		ip saddr 10.214.11.2 tcp dport 49152-49215 counter name "streamed"
	}
}
"""


def _hosts_dir() -> Path:
    return Path(f"/var/lib/rift-hosts/tls-{os.getpid()}")  # not /tmp: the hosts hide it


def _script(*args: str) -> str:
    env = {**os.environ, "RIFT_HOSTS_DIR": str(_hosts_dir())}
    done = subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"netns-hosts.sh {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@pytest.fixture(scope="module")
def far_hosts() -> Iterator[dict[int, str]]:
    """hv11 and hv12, up with their certificates, and the stranger's namespace."""
    try:
        for n in (FIRST, SECOND):
            _script("up", str(n))
        _script("net", str(STRANGER))
        yield {n: _script("uri", str(n)) for n in (FIRST, SECOND)}
    finally:
        for n in (FIRST, SECOND, STRANGER):
            _script("down", str(n))
        shutil.rmtree(_hosts_dir(), ignore_errors=True)


# The module's `rift serve` on qemu:///system, the harness's (tests/support/
# real_guests.py): `debian` seeded; stopping it checks that it left no domain here.
REAL = RealSettings(debian=True)


@pytest.fixture
def plane(real: Server) -> Server:
    return real


def _in_ns(n: int, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", f"rift-hv{n}", *argv], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def _nft(n: int, script: str) -> str:
    """`nft` in hvN's network namespace: a script (several lines) or one command."""
    several = "\n" in script
    done = _in_ns(n, "nft", *(["-f", "-"] if several else script.split()),
                  stdin=script if several else None)
    assert done.returncode == 0, (script, done.stderr)
    return done.stdout


def _set(n: int, name: str) -> str:
    table = _nft(n, "list table inet rift_guests")
    return table.split(f"set {name} {{", 1)[1].split("}", 1)[0]


def _count(n: int, counter: str, table: str = "inet rift_guests") -> int:
    said = _nft(n, f"list counter {table} {counter}")
    return int(said.split("packets", 1)[1].split()[0])


def _domains(uri: str) -> str:
    return subprocess.run(["virsh", "-c", uri, "list", "--all", "--name"], capture_output=True,
                          text=True, timeout=60, check=True).stdout


def _stranger_client(into: Path, tmp: Path) -> None:
    """A client certificate for hv11 signed by a CA that is not the hosts'."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], capture_output=True, check=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=stranger CA", "-keyout", str(tmp / "ca-key.pem"), "-out", str(tmp / "ca.pem"),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=hv11", "-keyout",
            str(into / "client-key.pem"), "-out", str(tmp / "client.csr"))
    (tmp / "ext").write_text("basicConstraints=critical,CA:FALSE\n"
                             "keyUsage=critical,digitalSignature,keyEncipherment\n"
                             "extendedKeyUsage=clientAuth\nsubjectAltName=IP:10.214.11.2\n")
    openssl("x509", "-req", "-in", str(tmp / "client.csr"), "-CA", str(tmp / "ca.pem"),
            "-CAkey", str(tmp / "ca-key.pem"), "-set_serial", "7", "-days", "2",
            "-extfile", str(tmp / "ext"), "-out", str(into / "client-cert.pem"))
    for name in ("client-cert.pem", "client-key.pem"):
        _put(into / name, into / name)


def _put(source: Path, dest: Path) -> None:
    """A certificate or key into a host's /etc/pki/qemu, as netns-hosts.sh puts them
    (root:rift-qemu, keys 0640): QEMU runs as rift-qemu and reads them itself."""
    if source != dest:
        shutil.copyfile(source, dest)
    shutil.chown(dest, "root", "rift-qemu")
    dest.chmod(0o640 if dest.name.endswith("-key.pem") else 0o644)


def _reaches(source: int, port: int) -> bool:
    """Whether namespace rift-hv<source> opens a TCP connection to hv12's port."""
    done = _in_ns(source, "python3", "-c",
                  f"import socket; socket.create_connection(('10.214.12.2', {port}), 3)")
    return done.returncode == 0


def _fleet(plane: Server, far_hosts: dict[int, str]) -> None:
    """hv11 and hv12 added to `rift serve`, which filled their sets over SSH: hv11's
    QEMU may reach hv12's migration ports (peers), which answer hv11 (fleet)."""
    listed = plane.rift("host", "list", "--json").stdout
    for n, uri in far_hosts.items():
        if f'"hv{n}"' not in listed:
            added = plane.rift("host", "add", f"hv{n}", uri)
            assert added.returncode == 0, added.stderr
    wait_until(lambda: f"10.214.{SECOND}.2" in _set(FIRST, "peers_v4")
               and f"10.214.{FIRST}.2" in _set(SECOND, "fleet_v4"), 60,
               "hv11's peer set names hv12 and hv12's fleet set hv11", every_s=1)


@long_form("test_the_migration_ports_answer_the_fleet_only below; a live migration: "
           "tests/e2e/test_real_hosts.py's drain --move; the fleet's certificates: tests/ansible")
def test_a_debian_vm_moves_over_migration_tls_and_only_with_the_fleets_certificates(
        plane: Server, far_hosts: dict[int, str], tmp_path: Path) -> None:
    from tests.support.mcp_clients import call, mcp_session, run

    _fleet(plane, far_hosts)
    for name in ("local", f"hv{SECOND}"):  # the VM starts on hv11
        assert plane.rift("host", "drain", name).returncode == 0
    pki = _hosts_dir() / f"hv{FIRST}" / "pki-qemu"
    kept = tmp_path / "kept"
    shutil.copytree(pki, kept)
    seen: dict[str, Any] = {}

    def drain_move() -> tuple[int, str]:
        moved = plane.rift("host", "drain", f"hv{FIRST}", "--move")
        return moved.returncode, moved.stdout + moved.stderr

    async def scenario() -> None:
        async with mcp_session(plane.url, plane.token) as s:
            opened = await call(s, "rift_task_new", name="moving over TLS")
            handle = opened["handle"]
            vm = (await call(s, "rift_vm_new", handle=handle, image="debian"))["vm"]
            seen["vm"] = vm
            assert vm["host"] == f"hv{FIRST}" and vm["status"] == "running", vm
            assert plane.rift("host", "undrain", f"hv{SECOND}").returncode == 0
            vm_id = vm["id"]

            async def sh(command: str) -> str:
                done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id,
                                  command=command)
                return str(done["stdout"]).strip()

            await sh("echo on the disk before the move > /root/before && sync")
            counter = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id, wait_s=0,
                                 timeout_s=3600, command=COUNTER)
            await anyio.sleep(2)

            async def counted() -> list[int]:
                got = await call(s, "rift_vm_exec_get", handle=handle,
                                 exec_id=counter["exec_id"], stdout_offset=0)
                assert got["status"] == "running", got
                return [int(n) for n in got["stdout"].split()]

            refusals = {}
            for case in REFUSALS:
                for old in pki.iterdir():
                    old.unlink()
                if case == "another CA's certificate":
                    for name in ("ca-cert.pem", "server-cert.pem", "server-key.pem"):
                        _put(kept / name, pki / name)
                    stranger = tmp_path / "stranger"
                    stranger.mkdir()
                    _stranger_client(pki, stranger)
                before = await counted()
                started = time.monotonic()
                code, said = await anyio.to_thread.run_sync(drain_move)
                said += f" ({time.monotonic() - started:.1f} s)"
                await anyio.sleep(1)
                refusals[case] = (code, said, (await call(s, "rift_vm_get", vm_id=vm_id))["vm"],
                                  _domains(far_hosts[FIRST]), _domains(far_hosts[SECOND]),
                                  before, await counted())
            seen["refusals"] = refusals
            # hv11's own certificates back: the move goes, over hv12's migration ports
            for old in pki.iterdir():
                old.unlink()
            for saved in kept.iterdir():
                _put(saved, pki / saved.name)
            _nft(SECOND, WATCH)
            before = await counted()
            started = time.monotonic()
            seen["move"] = await anyio.to_thread.run_sync(drain_move)
            seen["move_s"] = time.monotonic() - started
            seen["streamed"] = _count(SECOND, "streamed", "inet rift_test_tls")
            _nft(SECOND, "delete table inet rift_test_tls")
            seen["moved vm"] = (await call(s, "rift_vm_get", vm_id=vm_id))["vm"]
            seen["on"] = (_domains(far_hosts[FIRST]), _domains(far_hosts[SECOND]))
            await anyio.sleep(2)
            seen["counts"] = (before, await counted())
            # read from the disk there, not from the page cache that moved with it
            seen["file"] = await sh("sync; echo 3 > /proc/sys/vm/drop_caches; "
                                    "cat /root/before")
            events = await call(s, "rift_task_events", task_id=opened["task"]["id"])
            seen["events"] = [e for e in events["events"] if e["type"] == "vm_moved"]
            await call(s, "rift_task_close", handle=handle)

    run(scenario, 900)
    vm_id = seen["vm"]["id"]
    domain = f"rift-{vm_id}"
    for case, (code, said, vm, on_first, on_second, before, after) in seen[
            "refusals"].items():
        assert code != 0 and vm_id in said, (case, said)
        assert (vm["host"], vm["status"]) == (f"hv{FIRST}", "running"), (case, vm)
        assert domain in on_first and domain not in on_second, (case, on_first, on_second)
        assert after[:len(before)] == before and len(after) > len(before), (case, before, after)
        print(f"\n{case}: refused: {said.strip()}")
    code, said = seen["move"]
    print(f"\nrift host drain --move said: {said.strip()} ({seen['move_s']:.1f} s)")
    assert code == 0, said
    vm = seen["moved vm"]
    assert (vm["host"], vm["status"]) == (f"hv{SECOND}", "running"), vm
    on_first, on_second = seen["on"]
    assert domain not in on_first and domain in on_second, seen["on"]
    before, after = seen["counts"]
    assert after[:len(before)] == before and len(after) > len(before) + 2, seen["counts"]
    assert seen["file"] == "on the disk before the move"
    assert seen["streamed"] > 100, seen["streamed"]  # QEMU to QEMU, on the migration ports
    [moved] = seen["events"]
    assert (moved["details"]["from"], moved["details"]["to"]) == (f"hv{FIRST}", f"hv{SECOND}")
    print(f"vm_moved: {moved['details']['ms']} ms")


def test_the_migration_ports_answer_the_fleet_only(
        plane: Server, far_hosts: dict[int, str]) -> None:
    """A listener on one of hv12's migration ports: hv11 (in hv12's fleet set, which
    `rift serve` filled) reaches it; the stranger does not, and hv12 counts the drop
    as `migration_refused`."""
    _fleet(plane, far_hosts)
    fleet = _set(SECOND, "fleet_v4")
    assert f"10.214.{FIRST}.2" in fleet and f"10.214.{STRANGER}.2" not in fleet, fleet
    listener = subprocess.Popen(
        ["ip", "netns", "exec", f"rift-hv{SECOND}", "python3", "-c",
         "import socket\n"
         f"s = socket.create_server(('10.214.{SECOND}.2', {PROBE_PORT}))\n"
         "while True:\n    s.accept()[0].close()\n"])
    try:
        wait_until(lambda: _reaches(FIRST, PROBE_PORT), 10, "hv11 reaches hv12's port")
        refused = _count(SECOND, "migration_refused")
        assert not _reaches(STRANGER, PROBE_PORT)
        assert _count(SECOND, "migration_refused") > refused
        # the stranger reaches hv12 as such (its SSH): only the migration ports are shut
        assert _reaches(STRANGER, 22)
    finally:
        listener.kill()
        listener.wait()
