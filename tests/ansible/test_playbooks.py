"""The Ansible roles, run for real.

Three throwaway Debian bookworm machines are made on this one: directories made
with debootstrap, each run in a network namespace of its own (made by
scripts/netns-hosts.sh: 10.214.N.2, joined to this machine by a veth pair, the
machines reaching one another through it), reached with Ansible's
`community.general.chroot` connection through `ip netns exec`, with no systemd
inside (so the roles take their `tini` paths). `site.yml` runs against them
(`cp1` a control plane, `hv1` and `hv2` hypervisors), what it wrote is checked,
the fleet it started is used, and a second run must report no change at all
(`make soak` runs that second run and `hv2`; `make test` stops before the second
run, with `hv1` its only hypervisor: what each hypervisor gets is the same).

What is real: every apt install (from a cache of .debs kept between runs), the
venv install of a wheel built from this checkout (its dependencies from a
cached wheelhouse, offline), PostgreSQL's role and database (the cluster runs
inside the chroot, on its Unix socket only), the migration, `rift image build
tiny`, the image's copy to the hypervisors, the SSH key and host key exchange,
sshd and libvirtd started on each hypervisor and Rift on the control plane
(under the roles' no-systemd scripts), `rift host add` of each hypervisor by
its qemu+ssh:// URI, and a `tiny` VM booted by that Rift on a hypervisor and
reached through its SSH.

The first run builds the base system and the wheelhouse under
var/cache/ansible-target; later runs copy them. Needs root (debootstrap,
chroot); nothing of this machine's own /etc is touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cache import CACHE as TEST_CACHE
from tests.support.http_proxy import HttpProxy
from tests.support.soak import SOAK

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
VENV_BIN = Path(sys.executable).parent
CACHE = TEST_CACHE / "ansible-target"
BASE_VERSION = "1"  # bump to rebuild the cached base system
BASE_PACKAGES = "python3,python3-apt,sudo"
SUITE = "bookworm"
ADMIN_PASSWORD = "ansible-test-password-1"
# each in rift-hvN, at 10.214.N.2; make test's fleet has one hypervisor, make soak's two
HYPERVISORS = ("hv1", "hv2") if SOAK else ("hv1",)
MACHINES = {"cp1": 31, "hv1": 32, "hv2": 33} if SOAK else {"cp1": 31, "hv1": 32}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: debootstrap and chroot"),
]


# the base system, the caches


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (the only one reachable here)."""
    found: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if SUITE in fields.get("Suites", "").split() and "main" in fields.get(
                    "Components", "").split():
                found += fields.get("URIs", "").split()
    sources_list = Path("/etc/apt/sources.list")
    if sources_list.exists():
        found += re.findall(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s.*\bmain\b",
                            sources_list.read_text(), re.M)
    return found[0] if found else "http://deb.debian.org/debian"


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kwargs)


def ensure_debootstrap() -> None:
    if shutil.which("debootstrap"):
        return
    run(["apt-get", "update", "-qq"])
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """One test session at a time builds the cached base and wheelhouse."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def base_system() -> Path:
    """A minimal bookworm with Python (what Ansible needs of a host), made once."""
    base = CACHE / f"base-{SUITE}-{BASE_VERSION}"
    if (base / ".rift-complete").exists():
        return base
    ensure_debootstrap()
    work = CACHE / f"base-{SUITE}-{BASE_VERSION}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    debs = CACHE / "debootstrap-debs"
    debs.mkdir(parents=True, exist_ok=True)
    run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}",
         f"--cache-dir={debs}", SUITE, str(work), debian_mirror()], timeout=900)
    # As in any container image: packages do not start services at install.
    policy = work / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    (work / ".rift-complete").touch()
    shutil.rmtree(base, ignore_errors=True)
    work.rename(base)
    return base


def wheelhouse() -> Path:
    """Wheels of Rift's dependencies (libvirt-python compiled once, here), so the
    role's pip install runs offline: `--no-index --find-links`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [project["dependencies"], project["optional-dependencies"]["postgres"]]
    digest = hashlib.sha256(json.dumps(wanted).encode()).hexdigest()[:16]
    wheels = CACHE / f"wheels-{digest}"
    if (wheels / ".rift-complete").exists():
        return wheels
    work = wheels.with_suffix(".tmp")
    shutil.rmtree(work, ignore_errors=True)
    run([str(VENV_BIN / "pip"), "wheel", "--quiet", "--disable-pip-version-check",
         "--wheel-dir", str(work), f"{ROOT}[postgres]"], timeout=900)
    for old in work.glob("rift-*.whl"):  # the role builds and copies its own
        old.unlink()
    (work / ".rift-complete").touch()
    shutil.rmtree(wheels, ignore_errors=True)
    work.rename(wheels)
    return wheels


def link_tree(src: Path, dest: Path, pattern: str = "*") -> None:
    """Hard-link the files of `src` into `dest` (same filesystem: instant; copied
    across a mount, which a target's root is)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in src.glob(pattern):
        target = dest / path.name
        if path.is_file() and not target.exists():
            try:
                os.link(path, target)
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copy2(path, target)


# the targets


def mounts_under(path: Path) -> list[str]:
    """The mounts at `path` and under it."""
    real = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        return [point for line in mounts
                if (point := line.split()[1]) == real or point.startswith(real + "/")]


def processes_in(path: Path) -> list[int]:
    """PIDs of processes whose root is inside `path`: the ones started in it."""
    real = str(path.resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            root = os.readlink(entry / "root")
            if root == real or root.startswith(real + "/"):
                pids.append(int(entry.name))
    return pids


def stop_processes_in(path: Path) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        pids = processes_in(path)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while processes_in(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not processes_in(path):
            return


def remove_target(path: Path) -> None:
    if not path.exists():
        return
    stop_processes_in(path)
    for mount in sorted(mounts_under(path), reverse=True):
        subprocess.run(["umount", "-l", mount], check=False)
    leftover = mounts_under(path)
    assert not leftover, f"still mounted, not removing {path}: {leftover}"
    shutil.rmtree(path)


def remove_stale_targets() -> None:
    """Targets left by test sessions that died (named after their process)."""
    targets = CACHE / "targets"
    for path in targets.iterdir() if targets.is_dir() else []:
        pid = path.name.split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove_target(path)


def make_target(name: str) -> Path:
    # Named after this process: two sessions on one checkout do not meet.
    path = CACHE / "targets" / f"{os.getpid()}-{name}"
    remove_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    run(["cp", "-a", "--reflink=auto", str(base_system()), str(path)])
    (path / ".rift-complete").unlink()
    link_tree(CACHE / "apt-archives", path / "var/cache/apt/archives", "*.deb")
    # Its root a mount point, as a container's is (libvirt makes each QEMU's mount
    # namespace from it), then a fresh procfs of its own (facts, postinst scripts
    # and PostgreSQL read it).
    run(["mount", "--bind", str(path), str(path)])
    run(["mount", "-t", "proc", "proc", str(path / "proc")])
    # The host's /sys and a /dev of its own, as a container has: libvirtd reads the
    # first, and gives each QEMU a private /dev made from the second.
    run(["mount", "-t", "sysfs", "sysfs", str(path / "sys")])
    run(["mount", "-t", "devtmpfs", "devtmpfs", str(path / "dev")])
    return path


def keep_debs(target: Path) -> None:
    """Keep the .debs apt fetched for the next run."""
    link_tree(target / "var/cache/apt/archives", CACHE / "apt-archives", "*.deb")


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, Path]]:
    (CACHE / "apt-archives").mkdir(parents=True, exist_ok=True)
    with cache_lock():
        remove_stale_targets()
        base_system()
        wheels = wheelhouse()
    targets: dict[str, Path] = {}
    proxy: HttpProxy | None = None
    try:
        for n in MACHINES.values():
            namespace(n, "net")
        # The machines reach only this one: their apt gets the mirror through a proxy.
        proxy = HttpProxy([f"10.214.{n}.1" for n in MACHINES.values()]).start()
        for name, n in MACHINES.items():
            targets[name] = make_target(name)
            (targets[name] / "etc/apt/apt.conf.d/00rift-test-proxy").write_text(
                f'Acquire::http::Proxy "http://10.214.{n}.1:{proxy.port}/";\n'
                'Acquire::http::Pipeline-Depth "0";\n')
        link_tree(wheels, targets["cp1"] / "var/cache/rift-wheels", "*.whl")
        yield targets
    finally:
        if proxy is not None:
            proxy.stop()
        for name, path in targets.items():
            with contextlib.suppress(OSError):
                keep_debs(path)
            if os.environ.get("RIFT_KEEP_ANSIBLE_TARGETS") != "1":
                namespace(MACHINES[name], "down")  # its processes too
                remove_target(path)


def namespace(n: int, action: str) -> None:
    done = subprocess.run([str(ROOT / "scripts/netns-hosts.sh"), action, str(n)],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:  # a machine where it cannot be made fails, not skips
        pytest.fail(f"netns-hosts.sh {action} {n}: {done.stderr.strip()}")


def address(name: str) -> str:
    return f"10.214.{MACHINES[name]}.2"


def entry(work: Path, name: str) -> Path:
    """`chroot`, in the machine's network namespace: Ansible's way in (chroot_exe)."""
    path = work / f"chroot-{name}"
    path.write_text(f"#!/bin/sh\nexec ip netns exec rift-hv{MACHINES[name]} chroot \"$@\"\n")
    path.chmod(0o755)
    return path


def snapshot_checkout(dest: Path) -> Path:
    """What the wheel is built from, frozen for the test: the checkout may change
    under a running test (an edit in another window), and a changed source is a
    change that a second run must make."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for package in ("rift", "hypervisor", "web"):
        shutil.copytree(ROOT / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def write_inventory(fleet: dict[str, Path], work: Path) -> tuple[Path, Path]:
    inventory = work / "inventory.ini"
    inventory.write_text(
        "[control_plane]\n"
        f"cp1 ansible_host={fleet['cp1']} ansible_chroot_exe={entry(work, 'cp1')}\n"
        "[hypervisors]\n"
        + "".join(f"{hv} ansible_host={fleet[hv]} ansible_chroot_exe={entry(work, hv)} "
                  f"hypervisor_address={address(hv)}\n" for hv in HYPERVISORS)
        + "[all:vars]\n"
        "ansible_connection=community.general.chroot\n"
        "ansible_python_interpreter=/usr/bin/python3\n"
    )
    extra = work / "vars.json"
    extra.write_text(json.dumps({
        "rift_service_manager": "tini",
        "rift_stage_dir": str(work / "stage"),
        "rift_pki_dir": str(work / "pki"),
        "control_plane_source_dir": str(snapshot_checkout(work / "checkout")),
        "control_plane_pip_args": ["--no-index", "--find-links", "/var/cache/rift-wheels"],
        # No TCP at all: the Unix socket is enough.
        "control_plane_postgres_listen_addresses": "",
        "control_plane_admin_password": ADMIN_PASSWORD,
        # The `local` host's size given, so the rift command needs no libvirtd.
        "control_plane_settings": {"RIFT_HOST_VCPUS": 2, "RIFT_HOST_MEMORY_MIB": 2048,
                                   "RIFT_TASK_IDLE_S": 7200, "RIFT_SWEEP_INTERVAL_S": 2},
        "hypervisor_vcpus": 8,
        "hypervisor_memory_mib": 4096,
        # The role's KVM check boots a guest on each hypervisor (about 10 s under TCG):
        # make soak's; make test runs its script in test_kvm_probe_says_kvm_or_tcg_...
        "hypervisor_kvm_check": SOAK,
    }))
    return inventory, extra


def playbook(inventory: Path, extra: Path, work: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
        "ANSIBLE_HOME": str(work / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "-e", f"@{extra}",
         str(ANSIBLE / "site.yml")],
        cwd=ANSIBLE, env=env, text=True, capture_output=True, timeout=1200, check=False)


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counts per host."""
    hosts = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        hosts[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    return hosts


def changed_tasks(output: str) -> list[str]:
    found, task = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed:"):
            found.append(f"{task}: {line}")
    return found


def in_chroot(root: Path, *argv: str, user: str | None = None, timeout: float = 120) -> str:
    """A command's output on the machine `root` (in its network namespace)."""
    command = ["ip", "netns", "exec", f"rift-hv{MACHINES[root.name.split('-', 1)[1]]}",
               "chroot", str(root)]
    if user:
        command += ["runuser", "-u", user, "--"]
    return run([*command, *argv], timeout=timeout).stdout


def read_env_file(path: Path) -> dict[str, str]:
    pairs = re.findall(r"^(RIFT_\w+)='([^']*)'$", path.read_text(), re.M)
    return dict(pairs)


# A task with a `tiny` VM through Rift's REST API on the control plane, a command
# run in it, and the task closed: run there, by the venv's Python.
BOOT_A_VM = """
import json, sys, urllib.error, urllib.request

def call(method, path, body=None, handle=None):
    headers = {"Authorization": "Bearer " + sys.argv[1], "Content-Type": "application/json"}
    if handle:
        headers["Rift-Handle"] = handle
    request = urllib.request.Request("http://127.0.0.1:8080/api/v1" + path, method=method,
                                     data=json.dumps(body or {}).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as refused:  # said on stdout, for the test to show
        print(json.dumps({"refused": path, "status": refused.code,
                          "body": refused.read().decode()}))
        sys.exit(0)

opened = call("POST", "/tasks", {"name": "deployed"})
handle, task_id = opened["handle"], opened["task"]["id"]
vm = call("POST", f"/tasks/{task_id}/vms", {"image": "tiny"}, handle)["vm"]
if vm["status"] != "running":
    print(json.dumps({"vm": vm, "exec": None}))
    sys.exit(0)
done = call("POST", f"/vms/{vm['id']}/exec", {"command": "echo hello from $(uname -m)"}, handle)
call("POST", f"/tasks/{task_id}/close", {}, handle)
print(json.dumps({"vm": vm, "exec": done}))
"""


# the tests


@pytest.mark.soak  # make soak runs it whole, its second run included
@pytest.mark.timeout(2400)
def test_site_sets_up_a_fleet_and_a_second_run_changes_nothing(
        fleet: dict[str, Path], tmp_path: Path) -> None:
    cp1, hv1 = fleet["cp1"], fleet["hv1"]
    hypervisors = [fleet[name] for name in HYPERVISORS]
    inventory, extra = write_inventory(fleet, tmp_path)

    started = time.monotonic()
    first = playbook(inventory, extra, tmp_path)
    print(f"first run: {time.monotonic() - started:.0f} s")
    (tmp_path / "first-run.log").write_text(first.stdout + first.stderr)
    assert first.returncode == 0, first.stdout[-12000:] + first.stderr[-4000:]
    counts = recap(first.stdout)
    assert set(counts) == set(MACHINES), first.stdout[-3000:]
    assert all(c["failed"] == 0 and c["unreachable"] == 0 for c in counts.values())
    assert all(c["changed"] > 0 for c in counts.values())

    # the control plane: Rift in a venv, its settings, its unit, the wrapper
    assert in_chroot(cp1, "/opt/rift/venv/bin/rift", "--help").startswith("usage: rift")
    env_file = cp1 / "etc/rift/rift.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert env_file.stat().st_uid == 0
    settings = read_env_file(env_file)
    assert settings["RIFT_DATA_DIR"] == "/var/lib/rift"
    assert settings["RIFT_DATABASE_URL"] == (
        "postgresql+psycopg://rift@/rift?host=/var/run/postgresql")
    assert settings["RIFT_HYPERVISOR_URI"] == "qemu:///system"
    assert settings["RIFT_TASK_IDLE_S"] == "7200"
    unit = (cp1 / "etc/systemd/system/rift.service").read_text()
    assert "ExecStart=/opt/rift/venv/bin/rift serve --host 127.0.0.1 --port 8080\n" in unit
    assert "EnvironmentFile=/etc/rift/rift.env\n" in unit
    assert "User=rift\n" in unit
    assert "[Install]\nWantedBy=multi-user.target" in unit
    # The settings parse as systemd and sh read them: through the wrapper.
    users = json.loads(in_chroot(cp1, "/usr/local/sbin/rift", "user", "list", "--json"))
    assert [u["name"] for u in users] == ["admin"]

    # PostgreSQL: the role and database exist, owned by rift, migrated to head
    revisions = in_chroot(
        cp1, "env", *(f"{k}={v}" for k, v in settings.items()),
        "/opt/rift/venv/bin/python", "-c",
        "from rift.config import Settings; "
        "from rift.store.migrate import current_revision, head_revision; "
        "print(current_revision(Settings().resolved_database_url()), head_revision())",
        user="rift").split()
    assert revisions[0] == revisions[1] != "None"
    owner = in_chroot(cp1, "psql", "-tAc",
                      "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname='rift'",
                      user="postgres")
    assert owner.strip() == "rift"

    # the image: built on the control plane, the same bytes on the hypervisors
    manifest = json.loads((cp1 / "var/lib/rift/images/tiny/manifest.json").read_text())
    for name in (manifest["kernel"]["file"], manifest["initrd"]["file"], "manifest.json"):
        built = (cp1 / "var/lib/rift/images/tiny" / name).read_bytes()
        for hv in hypervisors:
            assert (hv / "var/lib/rift/images/tiny" / name).read_bytes() == built, name

    # the hypervisor: libvirt as Rift needs it, started the tini way
    qemu_conf = (hv1 / "etc/libvirt/qemu.conf").read_text()
    # QEMU as its own user (SPEC §15), not the rift user that holds libvirt and SSH rights
    assert ('# rift: begin\nuser = "rift-qemu"\nremember_owner = 0\ngroup = "rift-guests"\n'
            'security_driver = "none"\ncgroup_controllers = [ "cpu", "cpuacct" ]\n'
            'stdio_handler = "file"\n'
            'default_tls_x509_cert_dir = "/etc/pki/qemu"\ndefault_tls_x509_verify = 1\n'
            'migrate_tls_x509_verify = 1\nnamespaces = [ ]\n# rift: end\n') in qemu_conf
    assert not re.search(r'^(user|group|security_driver)\s*=(?! "(rift-qemu|none|rift-guests)")',
                         qemu_conf, re.M)
    # the guests' isolation, as scripts/libvirt.sh loads it here (loaded when started)
    assert (hv1 / "etc/rift/guest_isolation.nft").read_bytes() == (
        ROOT / "hypervisor/guest_isolation.nft").read_bytes()
    assert "rift-guests" in (hv1 / "etc/group").read_text()
    libvirtd_conf = (hv1 / "etc/libvirt/libvirtd.conf").read_text()
    assert 'unix_sock_group = "libvirt"\nunix_sock_rw_perms = "0770"' in libvirtd_conf
    assert os.access(hv1 / "usr/local/sbin/rift-libvirtd", os.X_OK)
    assert (hv1 / "usr/bin/tini").exists() and (hv1 / "usr/sbin/libvirtd").exists()
    assert not (hv1 / "lib/systemd/systemd").exists()
    # what a volume's files need there (rift/guest/host_volume_content.py): the
    # FUSE export's fusermount3 runs setuid for the rift user, and debugfs
    assert (hv1 / "bin/fusermount3").stat().st_mode & 0o4000
    assert os.access(hv1 / "sbin/debugfs", os.X_OK)
    assert "libvirt" in in_chroot(hv1, "id", "-nG", "rift").split()
    # QEMU's own user: neither libvirt's group nor SSH rights; rift reads its serial logs
    assert set(in_chroot(hv1, "id", "-nG", "rift-qemu").split()) <= {"rift-qemu", "kvm"}
    assert not (hv1 / "nonexistent").exists()
    assert "rift-guests" in in_chroot(hv1, "id", "-nG", "rift").split()
    assert "/usr/sbin/nft -f -" in (hv1 / "etc/sudoers.d/rift-nft").read_text()
    # migration TLS: each hypervisor's own certificates for its address, of one CA
    # made on the controller, the keys QEMU's user reads and no one else
    ca = (tmp_path / "pki/ca-cert.pem").read_bytes()
    for name in HYPERVISORS:
        pki = fleet[name] / "etc/pki/qemu"
        assert (pki / "ca-cert.pem").read_bytes() == ca
        for role in ("server", "client"):
            checked = subprocess.run(
                ["openssl", "verify", "-CAfile", str(pki / "ca-cert.pem"), "-purpose",
                 f"ssl{role}", str(pki / f"{role}-cert.pem")], capture_output=True, text=True,
                check=False)
            assert checked.returncode == 0, checked.stdout + checked.stderr
            shown = run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                         str(pki / f"{role}-cert.pem")]).stdout
            assert f"IP Address:{address(name)}" in shown, shown
            key = pki / f"{role}-key.pem"
            assert key.stat().st_mode & 0o777 == 0o640
            assert key.stat().st_gid == int(in_chroot(fleet[name], "id", "-g", "rift-qemu"))
    assert len({(hv / "etc/pki/qemu/server-key.pem").read_bytes() for hv in hypervisors}) == len(
        hypervisors)

    # SSH: the control plane's key on the hypervisor, its host key on the control plane
    public_key = (cp1 / "var/lib/rift/.ssh/id_ed25519.pub").read_text().split()[:2]
    authorized = (hv1 / "var/lib/rift/.ssh/authorized_keys").read_text()
    assert " ".join(public_key) in authorized
    known = (cp1 / "var/lib/rift/.ssh/known_hosts").read_text()
    for name in HYPERVISORS:
        host_key = (fleet[name] / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        assert f"{address(name)} {' '.join(host_key)}" in known

    # each hypervisor registered with Rift, with the size it was given, and reached:
    # Rift, started on cp1, finds each one's libvirt answering at its qemu+ssh:// URI
    def hosts() -> dict[str, dict[str, Any]]:
        listed = json.loads(in_chroot(cp1, "/usr/local/sbin/rift", "host", "list", "--json"))
        return {h["name"]: h for h in listed}

    for name in HYPERVISORS:
        hv = hosts()[name]
        assert hv["uri"] == f"qemu+ssh://rift@{address(name)}/system"
        assert (hv["vcpus"], hv["memory_mib"]) == (8, 4096)
    in_chroot(cp1, "/usr/local/sbin/rift-service", "status")  # Rift answers
    deadline = time.monotonic() + 120
    while {hosts()[n]["state"] for n in HYPERVISORS} != {"active"}:
        assert time.monotonic() < deadline, hosts()
        time.sleep(1)
    for hv in hypervisors:  # each hypervisor's own libvirtd, in its own namespace
        assert "Running hypervisor: QEMU" in in_chroot(hv, "virsh", "-c", "qemu:///system",
                                                      "version")

    # a VM booted by that Rift on a hypervisor, and reached through its SSH
    in_chroot(cp1, "/usr/local/sbin/rift", "host", "drain", "local")  # cp1 runs no libvirtd
    token = in_chroot(cp1, "/usr/local/sbin/rift", "token", "new", "admin").strip()
    (cp1 / "tmp/boot.py").write_text(BOOT_A_VM)
    said = json.loads(in_chroot(cp1, "/opt/rift/venv/bin/python", "/tmp/boot.py", token,
                                timeout=600).strip().splitlines()[-1])
    assert "vm" in said, said
    vm = said["vm"]
    assert vm["status"] == "running" and vm["host"] in HYPERVISORS, (
        f"{vm['status']} on {vm['host']}: {vm.get('error')}")
    assert said["exec"]["stdout"] == "hello from x86_64\n", said
    on = fleet[vm["host"]]
    assert f"rift-{vm['id']}" not in in_chroot(on, "virsh", "-c", "qemu:///system", "list",
                                              "--all", "--name")  # the task closed: gone

    if not SOAK:  # make test stops here: the second run (about 45 s) is make soak's
        return
    started = time.monotonic()
    second = playbook(inventory, extra, tmp_path)
    print(f"second run: {time.monotonic() - started:.0f} s")
    (tmp_path / "second-run.log").write_text(second.stdout + second.stderr)
    assert second.returncode == 0, second.stdout[-12000:] + second.stderr[-4000:]
    counts = recap(second.stdout)
    assert set(counts) == set(MACHINES)
    assert all(c["changed"] == 0 for c in counts.values()), (
        "not idempotent; changed on the second run:\n" + "\n".join(changed_tasks(second.stdout)))


def test_ansible_lint_and_yamllint_are_clean() -> None:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    for argv in (["ansible-lint", "--offline", "--profile", "production", "--nocolor"],
                 ["yamllint", "--strict", "."]):
        done = subprocess.run([str(VENV_BIN / argv[0]), *argv[1:]], cwd=ANSIBLE, text=True,
                              capture_output=True, timeout=600, check=False, env=env)
        assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-8000:]


def test_the_role_knows_every_rift_setting() -> None:
    import yaml

    from rift.config import Settings

    known = yaml.safe_load(
        (ANSIBLE / "roles/control_plane/vars/main.yml").read_text())["control_plane_known_settings"]
    assert sorted(known) == sorted(f"RIFT_{name.upper()}" for name in Settings.model_fields)


def test_kvm_probe_says_kvm_or_tcg_on_this_machine() -> None:
    """The hypervisor role's KVM check, against this machine's own libvirtd."""
    if subprocess.run(["virsh", "-c", "qemu:///system", "version"], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("no libvirtd answers on qemu:///system (make test starts one)")
    from hypervisor.base import ImageError
    from hypervisor.image_files import image_files
    from hypervisor.tiny import build_tiny

    images = TEST_CACHE / "test-images"  # shared with the guest tests
    try:
        build_tiny(images)
    except ImageError as exc:
        pytest.fail(f"cannot build tiny: {exc}")
    tiny = image_files(images, "tiny")
    done = subprocess.run(
        ["sh", str(ANSIBLE / "roles/hypervisor/files/kvm-probe"), str(tiny.kernel),
         str(tiny.initrd)], text=True, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    verdict = done.stdout.strip()
    assert re.fullmatch(r"(kvm|tcg): .+", verdict), verdict
    assert not subprocess.run(["virsh", "-c", "qemu:///system", "list", "--name"],
                              capture_output=True, text=True, check=True
                              ).stdout.count("rift-kvm-probe-")
