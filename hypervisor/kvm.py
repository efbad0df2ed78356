"""Whether guests here run under KVM or TCG, found by booting one.

`/dev/kvm` existing proves little: on some machines it is a paravirtual KVM
that refuses real guests (QEMU aborts at start on an MSR, or the guest stops
with an emulation failure). So the probe boots the `tiny` image as a `kvm`
domain, exactly as Rift would, and waits briefly for its init's first marker
on the serial console. The verdict is cached in a file, keyed by the host's
kernel release, the QEMU version, the URI and the guest kernel, so a start
does not probe again.

The probe reads the serial log on this machine, so it answers for local URIs
(`qemu:///system`, `qemu:///session`); a remote host's verdict is "qemu" unless
told otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from hypervisor.base import DomainSpec, HypervisorError
from hypervisor.image_files import ImageFiles
from hypervisor.kernel_boot import INIT_MARKER

KVM = "kvm"
TCG = "qemu"
PROBE_TIMEOUT_S = 10.0
_POLL_S = 0.05
_QEMU_LOG_DIR = Path("/var/log/libvirt/qemu")
_KVM_FAILURES = ("KVM internal error", "emulation failure", "failed to set MSR")
_LOCAL_URIS = ("qemu:///system", "qemu:///session")


PROBE_TASK = "probe"  # the task id in a probe guest's Rift metadata
PROBE_STALE_S = 600  # a probe lasts seconds: its guest still there after this was left


def probe_started_at(task_id: str | None, vm_id: str | None) -> float | None:
    """When the probe guest with this Rift metadata was made (seconds since the
    epoch), or None for a domain that is not a probe's."""
    if task_id != PROBE_TASK or vm_id is None:
        return None
    match = re.fullmatch(r"probe-(\d+)-[0-9a-f]+", vm_id)
    return float(match.group(1)) if match else None


def probe_accel(
    image: ImageFiles,
    uri: str = "qemu:///system",
    *,
    cache_file: Path | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
    install: str | None = None,
) -> tuple[str, str]:
    """("kvm" | "qemu", why): the domain type guests should get on `uri`.

    `cache_file` (default `<images dir>/.accel.json`) keeps verdicts between starts.
    The probe's guest carries Rift metadata with `install` and when it was made, so
    reconciliation destroys one a crash left behind (`probe_started_at`).
    """
    if uri not in _LOCAL_URIS:
        return TCG, f"{uri} is not local: the probe cannot read its serial log; TCG is safe"
    if not os.path.exists("/dev/kvm"):
        return TCG, "/dev/kvm is missing: guests run under TCG"
    cache = cache_file or image.kernel.parent.parent / ".accel.json"
    key = _cache_key(image, uri)
    cached = _read_cache(cache, key)
    if cached is not None:
        return cached
    verdict, lasting = _probe(image, uri, timeout_s, install)
    if lasting:
        _write_cache(cache, key, verdict)
    return verdict


def _probe(image: ImageFiles, uri: str, timeout_s: float,
           install: str | None) -> tuple[tuple[str, str], bool]:
    """The verdict, and whether it is worth caching (not when libvirt itself failed)."""
    from hypervisor.libvirt import LibvirtHypervisor

    probe_id = f"probe-{int(time.time())}-{secrets.token_hex(4)}"
    name = f"rift-{probe_id}"
    work = Path(tempfile.mkdtemp(prefix="rift-probe-"))
    serial = work / "serial.log"
    spec = DomainSpec(
        name=name, task_id=PROBE_TASK, vm_id=probe_id, vcpus=1, memory_mib=128,
        image=image.name, domain_type=KVM, kernel=str(image.kernel), initrd=str(image.initrd),
        cmdline=image.cmdline_base, serial_log=str(serial), install=install,
    )
    hv = LibvirtHypervisor(uri)
    try:
        started = time.monotonic()
        try:
            hv.create(spec)
        except HypervisorError as err:
            lasting = err.op == "start"  # open/define failures say nothing about KVM
            return (TCG, f"KVM refused to start a guest: {_first_line(err.message)}"), lasting
        try:
            while time.monotonic() - started < timeout_s:
                if INIT_MARKER in _read(serial):
                    took = time.monotonic() - started
                    return (KVM, f"a guest booted under KVM in {took:.1f}s"), True
                failure = _kvm_failure(name)
                if failure:
                    return (TCG, f"KVM failed the guest: {failure}"), True
                time.sleep(_POLL_S)
            return (TCG, f"a guest under KVM showed no sign of life in {timeout_s:.0f}s"), True
        finally:
            with contextlib.suppress(HypervisorError):
                hv.destroy(name)
    finally:
        hv.close()
        shutil.rmtree(work, ignore_errors=True)


def _kvm_failure(domain: str) -> str | None:
    for line in _read(_QEMU_LOG_DIR / f"{domain}.log").splitlines():
        if any(mark in line for mark in _KVM_FAILURES):
            return line.strip()
    return None


_READ_MAX = 1 << 20  # the probe guest's console is read this far, never whole


def _read(path: Path) -> str:
    try:
        with path.open("rb") as f:
            return f.read(_READ_MAX).decode(errors="replace")
    except OSError:
        return ""


def _first_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0].strip() if lines else text.strip()


# the cache


def qemu_version() -> str:
    binary = shutil.which("qemu-system-x86_64")
    if binary is None:
        return "none"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,  # noqa: S603
                             timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def _cache_key(image: ImageFiles, uri: str) -> dict[str, str]:
    try:
        guest = f"{image.kernel.name}:{image.kernel.stat().st_size}"
    except OSError:
        guest = image.kernel.name
    return {"uri": uri, "host_kernel": os.uname().release, "qemu": qemu_version(),
            "guest_kernel": guest}


def _read_cache(cache: Path, key: dict[str, str]) -> tuple[str, str] | None:
    try:
        entry = json.loads(cache.read_text()).get(key["uri"])
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    accel, why = entry.get("accel"), entry.get("why")
    if accel not in (KVM, TCG) or not isinstance(why, str):
        return None
    return str(accel), why


def _write_cache(cache: Path, key: dict[str, str], verdict: tuple[str, str]) -> None:
    try:
        data = json.loads(cache.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[key["uri"]] = {"key": key, "accel": verdict[0], "why": verdict[1],
                        "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        aside = cache.with_name(f".{cache.name}.{secrets.token_hex(4)}")
        aside.write_text(json.dumps(data, indent=2) + "\n")
        aside.replace(cache)
