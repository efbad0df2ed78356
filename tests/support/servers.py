"""A real `rift serve` (uvicorn on a loopback port): on libvirt's test driver by
default, or on `qemu:///system` with real guests (`start_real_server`); its
JSON log, and waiting for what it does."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import paramiko
import pytest

from hypervisor import write_test_host_xml
from tests.support.cache import CACHE as TEST_CACHE

ROOT = Path(__file__).resolve().parents[2]
# The libvirt the real-guest tests use: this machine's, unless RIFT_TEST_LIBVIRT_URI
# names another (a libvirtd configured otherwise, e.g. qemu+unix:///system?socket=…).
REAL_URI = os.environ.get("RIFT_TEST_LIBVIRT_URI", "qemu:///system")
# Where tests keep the `tiny` image between runs (shared with
# tests/integration/test_real_guest.py; the build is skipped when up to date).
TEST_IMAGES = TEST_CACHE / "test-images"
# Where tests keep the `debian` image and its debootstrapped root (not under
# test-images/, whose `debian/` holds the qcow2 that tests/e2e/test_real_qcow2.py
# registers), and the `python` image built from its recipe on it (`cached_python`).
DEBIAN_IMAGES = TEST_CACHE / "debian-images"
START_S = 30
T = TypeVar("T")


@dataclass(frozen=True)
class Server:
    url: str
    token: str  # the admin's API token
    password: str
    data_dir: Path
    env: dict[str, str]
    log: Path  # the server's stderr: its JSON logs

    def rift(self, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the `rift` command against this server's store."""
        return subprocess.run([sys.executable, "-m", "rift.cli", *argv], env=self.env,
                              capture_output=True, text=True, input=stdin, timeout=60,
                              check=False)

    def new_token(self, user: str, label: str) -> str:
        if user != "admin":
            self.rift("user", "add", user)
        made = self.rift("token", "new", user, "--label", label)
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(tmp: Path, **env_extra: str) -> tuple[subprocess.Popen[str], Server]:
    """`rift serve` on a fresh data dir `tmp/data`, on a private libvirt test-driver
    host unless `env_extra` names `RIFT_HYPERVISOR_URI`; `env_extra` overrides any
    variable."""
    env = dict(os.environ, RIFT_DATA_DIR=str(tmp / "data"))
    if "RIFT_HYPERVISOR_URI" not in env_extra:
        env["RIFT_HYPERVISOR_URI"] = write_test_host_xml(str(tmp / "node.xml"), 64, 262144)
    env.update(env_extra)
    log = tmp / "server.log"
    proc, url = launch(env, log, admin_lines=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    password = re.search(r"password: (\S+)", lines[1])
    token = re.search(r"token:\s+(rift_\S+)", lines[2])
    if not (password and token):
        stop_server(proc)
        pytest.fail(f"rift serve printed no admin: {lines}")
    wait_healthy(proc, url, log)
    return proc, Server(url, token.group(1), password.group(1), tmp / "data", env, log)


def restart_server(server: Server, **env_extra: str) -> tuple[subprocess.Popen[str], Server]:
    """`rift serve` again on `server`'s data dir (a new port; the admin and its token
    stay), with `env_extra` over its environment. Answers once /healthz does, that
    is after the start-up reconciliation."""
    env = dict(server.env, **env_extra)
    proc, url = launch(env, server.log, admin_lines=False)
    wait_healthy(proc, url, server.log)
    return proc, dataclasses.replace(server, url=url, env=env)


def launch(env: dict[str, str], log: Path,
            admin_lines: bool) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    with log.open("a") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rift.cli", "serve", "--port", str(port)],
            stdout=subprocess.PIPE if admin_lines else subprocess.DEVNULL, stderr=sink,
            env=env, text=True)
    scheme = "https" if env.get("RIFT_TLS_CERT") else "http"  # trusted by SSL_CERT_FILE
    return proc, f"{scheme}://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen[str], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"rift serve exited with {proc.returncode}: "
                        f"{log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    stop_server(proc)
    pytest.fail(f"rift serve did not answer /healthz within {START_S} s")


def stop_server(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)
    if proc.stdout is not None:
        proc.stdout.close()


def kill_server(proc: subprocess.Popen[str]) -> None:
    """`kill -9`: no shutdown, no cleanup; guests (libvirtd's children) live on."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=20)
    if proc.stdout is not None:
        proc.stdout.close()


# -- real guests --------------------------------------------------------------------------

@functools.cache
def real_vms_missing() -> str | None:
    """Why real guests cannot run here (None when they can): QEMU and a libvirtd
    answering on qemu:///system are needed (scripts/libvirt.sh provides both)."""
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (scripts/libvirt.sh installs it)"
    if shutil.which("virsh") is None:
        return "virsh is not installed (scripts/libvirt.sh installs libvirt-clients)"
    try:
        answer = subprocess.run(["virsh", "-c", REAL_URI, "version"], capture_output=True,
                                text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return f"libvirtd did not answer on {REAL_URI} within 30 s"
    if answer.returncode != 0:
        return (f"no libvirtd answers on {REAL_URI} ({answer.stderr.strip()}); "
                "scripts/libvirt.sh starts one")
    return None


@functools.cache
def cached_tiny() -> Path:
    """The `tiny` image folder, built once into the test cache (skipped when its
    inputs have not changed)."""
    from hypervisor.tiny import build_tiny

    return build_tiny(TEST_IMAGES)


@functools.cache
def cached_debian() -> Path:
    """The `debian` image folder, built once into the test cache (its debootstrapped
    root is kept there too; the build is skipped when its inputs have not changed;
    a lock keeps parallel runs from building it twice). Skips the test, in the
    builder's words, where it cannot be built (no debootstrap, no mirror)."""
    from hypervisor.base import ImageError
    from hypervisor.debian import build_debian

    DEBIAN_IMAGES.mkdir(parents=True, exist_ok=True)
    with (DEBIAN_IMAGES / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return build_debian(DEBIAN_IMAGES)
        except ImageError as exc:
            pytest.skip(f"the debian image cannot be built here: {exc}")


def python_inputs(debian: Path) -> str:
    """What the cached `python` image is made of: its recipe, the set of .debs the
    host's apt fetches for it (hypervisor.debs.set_key: the packages, `debian`'s root,
    the apt lists) and the `debian` image it is built FROM."""
    from hypervisor.debs import base_status, set_key
    from hypervisor.manifest import MANIFEST, digest, sha256_file
    from hypervisor.python_image import PACKAGES, RECIPE

    return digest(json.dumps({
        "recipe": RECIPE.read_text(), "debs": set_key(PACKAGES, base_status(debian.parent)),
        "debian": sha256_file(debian / MANIFEST)}).encode())


@functools.cache
def cached_python() -> Path:
    """The `python` image folder (SPEC §20), built from its recipe as an operator builds
    it (`rift image build python`: hypervisor/python.Recipe by Rift's builder, the
    .debs fetched by the host's apt) into the test cache beside the cached `debian`,
    once: again when its inputs (`python_inputs`) changed. The build runs in a data
    dir of its own, removed after (the image stands alone: its disk flattened, its
    saved state on `debian`'s kernel); about 12 minutes under TCG, told on stderr
    with its steps. Skips where `debian` cannot be built; fails with the build's log
    where the build fails."""
    from hypervisor.base import ImageError
    from hypervisor.snapshot_image import snapshot_image

    debian = cached_debian()
    target, stamp = DEBIAN_IMAGES / "python", DEBIAN_IMAGES / "python.inputs"
    with (DEBIAN_IMAGES / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        inputs = python_inputs(debian)
        try:
            snapshot_image(DEBIAN_IMAGES, "python")
            if stamp.read_text().strip() == inputs:
                return target
        except (ImageError, OSError):
            pass
        print(f"building the python image from hypervisor/python.Recipe into {target} "
              "(rift image build python; about 12 minutes under TCG) ...", file=sys.stderr,
              flush=True)
        work = DEBIAN_IMAGES / f".python-build-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        (work / "data" / "images").mkdir(parents=True)
        try:
            (work / "data" / "images" / "debian").symlink_to(debian, target_is_directory=True)
            began = time.monotonic()
            said = _build_python(work / "data")
            built = work / "data" / "images" / "python"
            if not (built / "manifest.json").is_file():
                pytest.fail(f"rift image build python made no image:\n{said[-4000:]}")
            stamp.unlink(missing_ok=True)
            if target.exists():
                shutil.rmtree(target)
            built.rename(target)
            stamp.write_text(inputs + "\n")
            print(f"built the python image in {time.monotonic() - began:.0f} s",
                  file=sys.stderr, flush=True)
        finally:
            destroy_installation(work / "data")
            shutil.rmtree(work, ignore_errors=True)
    return target


def _build_python(data_dir: Path) -> str:
    """`rift image build python` on qemu:///system in `data_dir`, its lines told on
    stderr as they come; answers them (fails the test where the build fails)."""
    env = dict(os.environ, RIFT_DATA_DIR=str(data_dir), RIFT_HYPERVISOR_URI=REAL_URI,
               RIFT_VM_BOOT_TIMEOUT_S="180")
    proc = subprocess.Popen([sys.executable, "-m", "rift.cli", "image", "build", "python"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        print(f"  {line.rstrip()[:200]}", file=sys.stderr, flush=True)
    said = "".join(lines)
    if proc.wait() != 0:
        pytest.fail(f"rift image build python failed:\n{said[-4000:]}")
    return said


def destroy_installation(data_dir: Path, uri: str = REAL_URI) -> None:
    """Destroy the domains a stopped server's data dir left running (a build cut
    short, a benchmark's scenario that failed before it closed its tasks): those of
    its installation only."""
    import sqlite3
    from contextlib import closing

    from hypervisor.libvirt import LibvirtHypervisor

    if not (data_dir / "rift.db").is_file():
        return
    with closing(sqlite3.connect(data_dir / "rift.db")) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'install_id'").fetchone()
    if row is None:
        return
    hv = LibvirtHypervisor(uri)
    try:
        for domain in hv.list_domains():
            if domain.install == row[0]:
                hv.destroy(domain.name)
    finally:
        hv.close()


def seed_images(data_dir: Path, debian: bool = False) -> Path:
    """Give a data dir the cached `tiny`, and with `debian` the cached `debian` (links:
    nothing is rebuilt or copied; the KVM probe's verdict is then cached beside the
    test image, once for all servers). Answers the data dir's images folder."""
    images = data_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    links = {"tiny": cached_tiny} | ({"debian": cached_debian} if debian else {})
    for name, cached in links.items():
        link = images / name
        if not link.exists():
            link.symlink_to(cached(), target_is_directory=True)
    return images


def start_real_server(tmp: Path, debian: bool = False,
                      **env_extra: str) -> tuple[subprocess.Popen[str], Server]:
    """`rift serve` on qemu:///system, its data dir seeded with the cached `tiny` (and,
    with `debian`, the cached `debian`)."""
    seed_images(tmp / "data", debian)
    return start_server(tmp, **{"RIFT_HYPERVISOR_URI": REAL_URI, **env_extra})


def log_lines(log: Path) -> list[dict[str, Any]]:
    """A server's JSON log lines (anything else on its stderr is skipped)."""
    lines = []
    for text in log.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue
    return lines


def wait_until(check: Callable[[], T | None], within_s: float, what: str,
               every_s: float = 0.1) -> T:
    deadline = time.monotonic() + within_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within_s:.0f} s: {what}")
        time.sleep(every_s)


# A counter in a guest (an exec that runs on): each count to stdout and to /tmp/count,
# which lands whole (written aside, then renamed), so a reader never sees it half-written.
COUNTER = ("i=0; while true; do i=$((i+1)); echo $i; echo $i > /tmp/count.new; "
           "mv /tmp/count.new /tmp/count; sleep 0.2; done")


def logs_in(port: int, key_file: Path) -> bool:
    """Whether root logs in to the guest with that private key (raw paramiko; the
    host key is not checked: this is the test's own guest on loopback)."""
    transport = paramiko.Transport(("127.0.0.1", port))
    try:
        transport.banner_timeout = transport.auth_timeout = 30
        transport.start_client(timeout=30)
        transport.auth_publickey("root", paramiko.Ed25519Key(filename=str(key_file)))
        chan = transport.open_session(timeout=30)
        chan.exec_command("true")
        return chan.recv_exit_status() == 0
    except paramiko.AuthenticationException:
        return False
    finally:
        transport.close()
