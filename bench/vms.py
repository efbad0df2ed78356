"""Real guests' benchmarks (issue #4), on qemu:///system with the `tiny` image
(TCG here: the KVM probe fails on this machine):

1. `rift_vm_new` until the first successful exec, through the engine
   (`rift.services.lifecycle.vms.new` then `execs.start`, with a real `build_deps`: the
   calls the MCP door makes, without HTTP), against the floor: the same domain
   XML (`guest_spec` + `build_domain_xml`, as Rift plans it) defined and
   started with raw libvirt, then polled with raw paramiko (connect, auth,
   exec `true`; 0.5 s banner timeout, 50 ms between tries) until an exec
   succeeds. Samples interleaved (who goes first alternates), each domain
   destroyed before the next is made; medians (target: Rift at most 1.1x the
   floor);
2. an exec round trip (`true`) on a running VM through the engine against raw
   paramiko on an open connection to the same guest (target: at most 1.5x);
3. density: `tiny` guests of 128 MiB booted through the engine one after
   another, all kept running, until `RIFT_BENCH_MAX_GUESTS` (24) or until
   MemAvailable would fall under 1 GiB; then every one answers an exec. The
   host memory each costs: the RSS of its QEMU process, and MemAvailable
   before and after.

Needs libvirtd on qemu:///system (scripts/libvirt.sh). The image is the one
the tests cache in var/cache/test-images (built when missing or stale).
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import libvirt
import paramiko

from bench.common import print_table, work_dir
from hypervisor.base import GuestDomain
from hypervisor.domain_xml import build_domain_xml
from hypervisor.image_files import ImageFiles, image_files
from hypervisor.kernel_boot import guest_spec
from hypervisor.tiny import build_tiny
from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.contract.execs import VmExecIn
from rift.contract.tasks import TaskCloseIn, TaskNewIn
from rift.contract.views import VmView
from rift.contract.vms import VmDestroyIn, VmNewIn
from rift.guest.keys import key_for_task, key_path, load_key
from rift.services.context import Caller, Deps
from rift.services.lifecycle import execs, tasks, vms

URI = "qemu:///system"
ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "var" / "cache" / "test-images"
CALLER = Caller("bench", "mcp:bench")
BOOT_SAMPLES = 7
EXEC_CALLS = 300
EXEC_BLOCKS = 15
FLOOR_POLL_S = 0.05
FLOOR_BANNER_S = 0.5
FLOOR_LIMIT_S = 120.0
DENSITY_MEMORY_MIB = 128
MAX_GUESTS = int(os.environ.get("RIFT_BENCH_MAX_GUESTS", "24"))
MEM_FLOOR_MIB = 1024


# -- the engine ------------------------------------------------------------------------

def _deps(data_dir: Path) -> Deps:
    images = data_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    (images / "tiny").symlink_to(build_tiny(IMAGES), target_is_directory=True)
    settings = Settings(data_dir=data_dir, hypervisor_uri=URI, log_level="WARNING",
                        host_vcpus=256, max_vms_per_task=256, rate_vm_new_per_h=10**6,
                        rate_task_new_per_h=10**6)
    return build_deps(settings)


def _rift_new_until_exec(deps: Deps, handle: str) -> tuple[float, str]:
    """Seconds from `rift_vm_new` to the end of the first successful exec."""
    started = time.perf_counter()
    vm = vms.new(deps, CALLER, VmNewIn(handle=handle, image="tiny")).vm
    if vm.status != "running":
        raise RuntimeError(f"the VM did not come up: {vm.error}")
    ran = execs.start(deps, CALLER, VmExecIn(handle=handle, vm_id=vm.id, command="true"))
    took = time.perf_counter() - started
    assert ran.exit_code == 0, ran
    return took, vm.id


# -- the floor: raw libvirt + raw paramiko ---------------------------------------------

class Floor:
    """Domains made from Rift's own XML by raw libvirt, reached by raw paramiko."""

    def __init__(self, image: ImageFiles, work: Path) -> None:
        self.image = image
        self.work = work
        self.conn = libvirt.open(URI)
        key_file, self.public_line = key_for_task(work / "keys", "task_benchflr")
        self.key = load_key(key_file)
        self.accel = _accel()
        self.made = 0

    def spec_xml(self, port: int) -> tuple[str, str]:
        self.made += 1
        name = f"rift-bench-floor-{os.getpid()}-{self.made}"
        spec = guest_spec(self.image, GuestDomain(
            name=name, task_id="task_benchflr", vm_id=f"vm_benchflr{self.made}", vcpus=1,
            memory_mib=256, domain_type=self.accel, ssh_port=port,
            serial_log=self.work / f"{name}.log"), self.public_line)
        return name, build_domain_xml(spec)

    def new_until_exec(self) -> tuple[float, str]:
        port = _free_port()
        name, xml = self.spec_xml(port)
        started = time.perf_counter()
        dom = self.conn.defineXML(xml)
        dom.create()
        transport = self._poll(port, started + FLOOR_LIMIT_S)
        took = time.perf_counter() - started
        transport.close()
        return took, name

    def _poll(self, port: int, deadline: float) -> paramiko.Transport:
        while time.perf_counter() < deadline:
            transport: paramiko.Transport | None = None
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=FLOOR_BANNER_S)
                transport = paramiko.Transport(sock)
                transport.banner_timeout = FLOOR_BANNER_S
                transport.start_client(timeout=10)
                transport.auth_publickey("root", self.key)
                if exec_true(transport) == 0:
                    return transport
            except (OSError, EOFError, paramiko.SSHException):
                pass
            if transport is not None:
                transport.close()
            time.sleep(FLOOR_POLL_S)
        raise RuntimeError("the floor's guest never answered an exec")

    def destroy(self, name: str) -> None:
        dom = self.conn.lookupByName(name)
        if dom.isActive():
            dom.destroy()
        dom.undefine()
        (self.work / f"{name}.log").unlink(missing_ok=True)

    def close(self) -> None:
        self.conn.close()


def exec_true(transport: paramiko.Transport) -> int:
    chan = transport.open_session(timeout=10)
    try:
        chan.exec_command("true")
        return chan.recv_exit_status()
    finally:
        chan.close()


def _accel() -> str:
    """The accelerator Rift would choose (the probe's cached verdict)."""
    from hypervisor.kvm import probe_accel

    return probe_accel(image_files(IMAGES, "tiny"), URI)[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- 1. boot to first exec ------------------------------------------------------------

def bench_boot(deps: Deps, floor: Floor) -> list[tuple[str, ...]]:
    handle = tasks.new(deps, CALLER, TaskNewIn(name="bench boot")).handle
    rift_s: list[float] = []
    floor_s: list[float] = []
    def rift_once() -> None:
        took, vm_id = _rift_new_until_exec(deps, handle)
        vms.destroy(deps, CALLER, VmDestroyIn(vm_id=vm_id, handle=handle))
        rift_s.append(took)

    def floor_once() -> None:
        took, name = floor.new_until_exec()
        floor.destroy(name)
        floor_s.append(took)

    rift_once()  # warm-up pair: caches, the task's key, the accelerator verdict
    floor_once()
    rift_s.clear()
    floor_s.clear()
    for i in range(BOOT_SAMPLES):  # alternate who goes first: drift hits both alike
        for one in ((rift_once, floor_once) if i % 2 else (floor_once, rift_once)):
            one()
    tasks.close(deps, CALLER, TaskCloseIn(handle=handle))
    rift_med, floor_med = statistics.median(rift_s), statistics.median(floor_s)
    ratio = rift_med / floor_med
    return [
        ("rift_vm_new + first exec (engine)", f"{rift_med:.2f}", _spread(rift_s), ""),
        ("floor: raw libvirt + raw paramiko polling", f"{floor_med:.2f}", _spread(floor_s), ""),
        ("ratio Rift / floor (target <= 1.1)", f"{ratio:.2f}", "",
         "ok" if ratio <= 1.1 else "MISSED"),
    ]


def _spread(samples: list[float]) -> str:
    return f"{min(samples):.2f}–{max(samples):.2f} (n={len(samples)})"


# -- 2. exec round trip ---------------------------------------------------------------

def _per_call(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def bench_exec(deps: Deps, keys_dir: Path) -> list[tuple[str, ...]]:
    handle = tasks.new(deps, CALLER, TaskNewIn(name="bench exec")).handle
    vm = vms.new(deps, CALLER, VmNewIn(handle=handle, image="tiny")).vm
    assert vm.status == "running" and vm.ssh is not None, vm
    transport = paramiko.Transport(socket.create_connection(("127.0.0.1", vm.ssh.port)))
    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
    transport.start_client(timeout=10)
    transport.auth_publickey("root", load_key(key_path(keys_dir, vm.task_id)))

    exec_true_in = VmExecIn(handle=handle, vm_id=vm.id, command="true")

    def rift_call() -> None:
        assert execs.start(deps, CALLER, exec_true_in).exit_code == 0

    def raw_call() -> None:
        assert exec_true(transport) == 0

    rift_s: list[float] = []
    raw_s: list[float] = []
    try:
        _per_call(rift_call, 10)
        _per_call(raw_call, 10)
        for _ in range(EXEC_BLOCKS):
            rift_s += _per_call(rift_call, EXEC_CALLS // EXEC_BLOCKS)
            raw_s += _per_call(raw_call, EXEC_CALLS // EXEC_BLOCKS)
    finally:
        transport.close()
        tasks.close(deps, CALLER, TaskCloseIn(handle=handle))
    rift_ms, raw_ms = statistics.median(rift_s) * 1e3, statistics.median(raw_s) * 1e3
    ratio = rift_ms / raw_ms
    return [
        ("rift_vm_exec `true` (engine, pooled SSH)", f"{rift_ms:.1f}", f"{_p90(rift_s):.1f}",
         ""),
        ("floor: raw paramiko, open connection", f"{raw_ms:.1f}", f"{_p90(raw_s):.1f}", ""),
        ("ratio Rift / floor (target <= 1.5)", f"{ratio:.2f}", "",
         "ok" if ratio <= 1.5 else "MISSED"),
    ]


def _p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[8] * 1e3


# -- 3. density -----------------------------------------------------------------------

def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def qemu_rss_mib(domain: str) -> tuple[float, float]:
    """(RSS, its anonymous part) of the domain's QEMU process, in MiB."""
    pid = int(Path(f"/run/libvirt/qemu/{domain}.pid").read_text().strip())
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["RssAnon"].split()[0]) / 1024)


def bench_density(deps: Deps) -> list[tuple[str, ...]]:
    handle = tasks.new(deps, CALLER, TaskNewIn(name="bench density")).handle
    before = mem_available_mib()
    boots: list[float] = []
    vms: list[VmView] = []
    stopped = f"the cap ({MAX_GUESTS})"
    began = time.perf_counter()
    try:
        while len(vms) < MAX_GUESTS:
            if mem_available_mib() - DENSITY_MEMORY_MIB * 1.5 < MEM_FLOOR_MIB:
                stopped = f"memory (MemAvailable near {MEM_FLOOR_MIB} MiB)"
                break
            started = time.perf_counter()
            vm = vms.new(deps, CALLER, VmNewIn(handle=handle, image="tiny",
                                                    memory_mib=DENSITY_MEMORY_MIB)).vm
            if vm.status != "running":
                stopped = f"a failed boot: {vm.error}"
                break
            boots.append(time.perf_counter() - started)
            vms.append(vm)
        filled = time.perf_counter() - began
        time.sleep(3)  # let the last guests settle
        answered = sum(execs.start(deps, CALLER, VmExecIn(handle=handle, vm_id=vm.id,
                                                             command="true")).exit_code == 0
                       for vm in vms)
        after = mem_available_mib()
        measured = [qemu_rss_mib(f"rift-{vm.id}") for vm in vms]
    finally:
        tasks.close(deps, CALLER, TaskCloseIn(handle=handle))
    n = len(vms)
    rss = [whole for whole, _ in measured]
    anon = [part for _, part in measured]
    return [
        ("guests running at once", str(n), f"stopped by {stopped}; {answered}/{n} answered "
         "an exec afterwards"),
        ("time to boot them one after another", f"{filled:.0f} s",
         f"first {boots[0]:.1f} s, last {boots[-1]:.1f} s, median "
         f"{statistics.median(boots):.1f} s"),
        ("QEMU RSS per guest (median)", f"{statistics.median(rss):.0f} MiB",
         f"{min(rss):.0f}–{max(rss):.0f} MiB, {sum(rss):.0f} MiB in all; anonymous "
         f"(not shared) {statistics.median(anon):.0f} MiB each"),
        ("MemAvailable before / after", f"{before:.0f} / {after:.0f} MiB",
         f"{(before - after) / n:.0f} MiB per guest"),
    ]


def main() -> None:
    try:
        libvirt.open(URI).close()
    except libvirt.libvirtError as exc:
        print(f"\n## real guests: skipped, no libvirtd on {URI} ({exc}); "
              "scripts/libvirt.sh starts one")
        return
    # The floor's failed polls (no guest yet) are expected: no tracebacks from paramiko.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    with work_dir("rift-bench-vms-") as tmp:
        work = Path(tmp)
        deps = _deps(work / "data")
        floor = Floor(image_files(IMAGES, "tiny"), work)
        try:
            boot = bench_boot(deps, floor)
            execs = bench_exec(deps, work / "data" / "keys")
            density = bench_density(deps)
        finally:
            floor.close()
            close_deps(deps)
    print_table(f"rift_vm_new until the first exec, {URI} ({floor.accel}), "
                "seconds", boot, ("path", "median s", "spread", ""))
    print_table("exec round trip on a running guest, ms", execs,
                ("call", "median ms", "p90 ms", ""))
    print_table(f"density: tiny guests of {DENSITY_MEMORY_MIB} MiB on this host", density,
                ("measure", "value", "detail"))


if __name__ == "__main__":
    main()
    sys.exit(0)
