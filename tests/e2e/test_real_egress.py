"""Egress and the guests' isolation from their host (SPEC §13) on real `tiny`
guests under TCG: a server in a network namespace of the test's own stands for
the networks beyond the host (an `open` guest reaches it, a `none` guest does
not), and servers on this host (on its loopback, which QEMU maps 10.0.2.2 to, on
its own address, and Rift's API itself) are reached by no guest. The firewall
that refuses them is scripts/libvirt.sh's (hypervisor/guest_isolation.nft): a
machine without it fails here, it is not skipped."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.client.session import ClientSession

from tests.support import netns
from tests.support.guest_packages import (
    DEB_GREETING,
    WHEEL_GREETING,
    WHEEL_MODULE,
    make_deb,
    make_wheel,
)
from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.netns import namespace, serving, wait_listening
from tests.support.real_guests import RealSettings
from tests.support.servers import (
    Server,
    free_port,
    real_vms_missing,
)
from tests.support.soak import SOAK, long_form

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

LIMIT_S = 240
BEYOND = "10.213.0.2"  # the namespace's end of the veth pair; the host's is .1
# The deny test's namespace (SPEC §15): one listener per address, on 8080; this host's
# end of its veth pair is 10.213.7.1/24, and 169.254.77.1 is routed to it (link-local;
# never 169.254.169.254, this machine's own metadata address, which no test touches).
ALLOWED, OPERATOR_DENIED, LINK_LOCAL = "10.213.7.2", "10.213.7.130", "169.254.77.1"
DENIED_CIDR = "10.213.7.128/25"  # RIFT_EGRESS_DENY of this module's server
# Names of BEYOND in this host's /etc/hosts while the tests run: the first is allowed.
BEYOND_NAMES = ["beyond.rift.test", "other.rift.test", "evil.rift.test"]
# busybox's static wget crashes looking names up even for an address; nc does not
FETCH = ("printf 'GET /{path} HTTP/1.0\\r\\n\\r\\n' | nc -w 4 {address} {port} 2>&1 "
         "| tail -n 1; echo exit=$?")


class Says(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.text.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def serve(address: str, port: int, text: str) -> http.server.HTTPServer:
    server = http.server.ThreadingHTTPServer((address, port), Says)
    server.text = text  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _certificate(folder: Path, names: list[str]) -> tuple[Path, Path]:
    """A self-signed certificate for `names` (the guest's curl is told -k)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the namespace's server serves: `beyond` at /, a file, a pip index with
    the test wheel, an apt repository with the test .deb, a git repository (git's
    dumb HTTP)."""
    root = tmp_path_factory.mktemp("beyond")
    (root / "index.html").write_text("beyond")
    (root / "hello.txt").write_text("hello from beyond\n")
    made = tmp_path_factory.mktemp("packages")
    wheel, deb = make_wheel(made), make_deb(made)
    index = root / "simple" / WHEEL_MODULE
    index.mkdir(parents=True)
    (index / wheel.name).write_bytes(wheel.read_bytes())
    (index / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    apt = root / "apt"
    apt.mkdir()
    (apt / deb.name).write_bytes(deb.read_bytes())
    control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True,
                             check=True).stdout.rstrip("\n")
    data = deb.read_bytes()
    packages = (f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n").encode()
    (apt / "Packages").write_bytes(packages)
    (apt / "Release").write_text(
        "Origin: rift-tests\nLabel: rift-tests\n"
        f"Date: {datetime.datetime.now(datetime.UTC):%a, %d %b %Y %H:%M:%S UTC}\n"
        f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n")
    work = made / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@rift.invalid"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "README").write_text("cloned through the egress proxy\n")
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-q", "-m", "one"], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(root / "repo.git")],
                   check=True)
    subprocess.run([*git, "-C", str(root / "repo.git"), "update-server-info"], check=True)
    return root


@pytest.fixture(scope="module")
def beyond(site: Path) -> Iterator[str]:
    """The site's server in a network namespace of its own, reached over a veth pair
    at BEYOND (8080 and 8443), and named in this host's /etc/hosts as BEYOND_NAMES
    (so the egress proxy, which resolves names on the host, finds it)."""
    hosts = Path("/etc/hosts")
    hosts_before = hosts.read_text()
    cert, key = _certificate(site.parent, BEYOND_NAMES)
    with namespace("egress", "10.213.0.1/30", [f"{BEYOND}/30"]) as ns, \
            serving(ns, netns.FILES, str(site), str(cert), str(key), BEYOND):
        for port in (8080, 8443):
            wait_listening(BEYOND, port)
        try:
            hosts.write_text(hosts_before.rstrip("\n") + f"\n{BEYOND} {' '.join(BEYOND_NAMES)}"
                             "  # rift tests\n")
            yield f"{BEYOND}:8080"
        finally:
            hosts.write_text(hosts_before)


def _host_address() -> str:
    """This host's own first non-loopback IPv4 address."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True, check=True).stdout
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines()
                 if not line.split()[1].startswith("rfe")]
    assert addresses, out
    return addresses[0]


def _refused() -> int:
    """Packets the guests' isolation has refused (its nft counter)."""
    listed = subprocess.run(["nft", "-j", "list", "counter", "inet", "rift_guests", "refused"],
                            capture_output=True, text=True, check=True).stdout
    found = [item["counter"] for item in json.loads(listed)["nftables"] if "counter" in item]
    return int(found[0]["packets"])


def _isolation_loaded(data_dir: Path) -> None:
    isolation = subprocess.run(["nft", "list", "table", "inet", "rift_guests"],
                               capture_output=True, text=True, check=False)
    assert isolation.returncode == 0, (
        "the guests' isolation is not loaded (scripts/libvirt.sh loads it): "
        + isolation.stderr.strip())


REAL = RealSettings(debian=SOAK, env={"RIFT_EGRESS_DENY": DENIED_CIDR,
                                      "RIFT_VM_BOOT_TIMEOUT_S": "90",
                                      # what VMs use, sampled often enough to be seen here
                                      "RIFT_STATS_INTERVAL_S": "2",
                                      "RIFT_SWEEP_INTERVAL_S": "5"},
                    prepare=_isolation_loaded)


def test_an_open_guest_reaches_beyond_its_host_a_none_guest_nothing_and_neither_the_host(
        real: Server, beyond: str, tmp_path: Path) -> None:
    loopback_port, own_port = free_port(), free_port()
    on_loopback = serve("127.0.0.1", loopback_port, "host loopback")
    on_own = serve("0.0.0.0", own_port, "host address")  # noqa: S104 (the test's own server)
    rift_port = int(real.url.rsplit(":", 1)[1])
    refused_before = _refused()
    host = _host_address()
    seen: dict[str, dict[str, str]] = {}

    async def scenario() -> None:
        async with mcp_session(real.url, real.token) as s:
            handle = (await call(s, "rift_task_new", name="egress"))["handle"]
            err = await refused(s, "invalid_argument", "rift_vm_new", handle=handle,
                                image="tiny", egress="sometimes")
            assert "egress" in json.dumps(err), err
            for egress in ("open", "none"):
                vm = (await call(s, "rift_vm_new", handle=handle, image="tiny",
                                 egress=egress))["vm"]
                assert vm["egress"] == egress and vm["status"] == "running", vm
                targets = {"beyond": (BEYOND, 8080, ""),
                           "loopback": ("10.0.2.2", loopback_port, ""),
                           "rift": ("10.0.2.2", rift_port, "healthz"),
                           "own address": (host, own_port, "")}
                seen[egress] = {}
                for label, (address, port, path) in targets.items():
                    command = FETCH.format(address=address, port=port, path=path)
                    done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                      command=command, timeout_s=30, wait_s=30)
                    seen[egress][label] = done["stdout"]
                await call(s, "rift_vm_destroy", handle=handle, vm_id=vm["id"])
            await call(s, "rift_task_close", handle=handle)

    try:
        run(scenario, LIMIT_S)
    finally:
        for server in (on_loopback, on_own):
            server.shutdown()
            server.server_close()
    print(f"\nwhat each guest's nc got: {seen}")
    assert seen["open"]["beyond"].startswith("beyond"), seen
    assert "beyond" not in seen["none"]["beyond"], seen
    for egress in ("open", "none"):
        for label in ("loopback", "rift", "own address"):
            out = seen[egress][label]
            assert "host loopback" not in out and "host address" not in out, (egress, label, out)
            assert '"status"' not in out and "refused" in out, (egress, label, out)
    # refused by the firewall (its counter), not missed: the servers were there
    assert _refused() - refused_before >= 3


# In the guest: a tunnel through the proxy to beyond.rift.test:8443, then TLS asking
# for the server name argv[1]; prints the CONNECT answer's status, then the page or
# what ended it.
TUNNEL = """
import socket, ssl, sys
s = socket.create_connection(("10.0.2.2", 3128), timeout=10)
s.sendall(b"CONNECT beyond.rift.test:8443 HTTP/1.1\\r\\nHost: beyond.rift.test:8443\\r\\n\\r\\n")
print(s.recv(1024).split(b"\\r\\n")[0].decode())
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
try:
    t = context.wrap_socket(s, server_hostname=sys.argv[1])
    t.sendall(b"GET /hello.txt HTTP/1.0\\r\\nHost: beyond.rift.test\\r\\n\\r\\n")
    page = b""
    while chunk := t.recv(4096):
        page += chunk
    print(page.decode().split("\\r\\n\\r\\n", 1)[-1].strip())
except (OSError, ssl.SSLError) as exc:
    print("ended:", type(exc).__name__)
"""
# In the guest: a DNS query for a name no list has, to QEMU's DNS and to BEYOND.
DNS = """
import socket, struct
name = b"".join(bytes([len(p)]) + p for p in b"secret.tunnel.rift.test".split(b"."))
query = (struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + name + b"\\0"
         + struct.pack(">HH", 1, 1))
for server in ("10.0.2.3", "10.213.0.2"):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(query, (server, 53))
    try:
        s.recv(512)
        print("answered by", server)
    except OSError:
        print("no answer from", server)
"""


def _counters() -> dict[str, int]:
    listed = subprocess.run(["nft", "-j", "list", "counters", "table", "inet", "rift_guests"],
                            capture_output=True, text=True, check=True).stdout
    return {item["counter"]["name"]: int(item["counter"]["packets"])
            for item in json.loads(listed)["nftables"] if "counter" in item}


def _refusals(srv: Server) -> dict[str, float]:
    """rift_egress_refused_total by reason, from the server's /metrics."""
    text = httpx.get(f"{srv.url}/metrics", timeout=10,
                     headers={"Authorization": f"Bearer {srv.token}"}).text
    found = {}
    for line in text.splitlines():
        if line.startswith("rift_egress_refused_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(line.rsplit(" ", 1)[1])
    return found


# In `tiny` (busybox: no curl, no python3; its static wget cannot look names up): a
# request to the proxy its environment names, by nc; prints the answer's status line
# and its last line.
ASK = ("p=${{http_proxy#http://}}; printf '{request}' | nc -w 10 ${{p%:*}} ${{p##*:}} 2>&1 "
       "| sed -n '1p;$p'")


def _ask(url: str, host: str) -> str:
    return ASK.format(request=f"GET {url} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n")


async def _allowlisted(s: ClientSession, image: str,
                       allow: dict[str, list[str]]) -> tuple[str, dict[str, Any]]:
    """A task and its VM of `image` with the allowlist `allow`, after the allowlists
    rift_vm_new refuses (a bad name, 65 names, none) were refused."""
    handle = (await call(s, "rift_task_new", name="allowlist"))["handle"]
    for bad, why in (({"allow": ["no such name!"]}, "neither a name"),
                     ({"allow": [f"h{i}.example" for i in range(65)]}, "64"),
                     ({"allow": []}, "allow")):
        err = await refused(s, "invalid_argument", "rift_vm_new", handle=handle,
                            image=image, egress=bad)
        assert "egress" in json.dumps(err) and why in json.dumps(err), err
    vm = (await call(s, "rift_vm_new", handle=handle, image=image, egress=allow))["vm"]
    assert vm["status"] == "running", vm
    assert vm["egress"] == {"allow": sorted(allow["allow"])}, vm
    return handle, vm


def test_an_allowlisted_tiny_guest_reaches_a_listed_name_through_the_proxy_and_nothing_else(
        real: Server, beyond: str) -> None:
    """The short form of the `debian` test below (make soak): a `tiny` guest with an
    allowlist is told the proxy, which takes it to a listed name and refuses another
    name, a Host that disagrees and the host itself; around the proxy the firewall
    refuses it; what it used is sampled. (The proxy's CONNECT and SNI checks:
    tests/integration/test_egress_proxy.py; pip, git and apt: the long form.)"""
    before, counted_before = _refusals(real), _counters()
    rift_port = int(real.url.rsplit(":", 1)[1])
    out: dict[str, str] = {}
    used: dict[str, Any] = {}
    allow = {"allow": ["beyond.rift.test", "192.0.2.0/24"]}
    checks = {
        "listed": _ask("http://beyond.rift.test:8080/hello.txt", "beyond.rift.test:8080"),
        "environment": "echo $http_proxy $https_proxy",
        "other name": _ask("http://other.rift.test:8080/", "other.rift.test:8080"),
        "host header": _ask("http://beyond.rift.test:8080/", "evil.rift.test"),
        "host itself": _ask(f"http://10.0.2.2:{rift_port}/healthz", f"10.0.2.2:{rift_port}"),
        "direct": FETCH.format(address=BEYOND, port=8080, path="hello.txt"),
        "host direct": FETCH.format(address="10.0.2.2", port=rift_port, path="healthz"),
    }

    async def scenario() -> None:
        async with mcp_session(real.url, real.token) as s:
            handle, vm = await _allowlisted(s, "tiny", allow)
            for label, command in checks.items():
                done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                  command=command, timeout_s=60, wait_s=60)
                out[label] = (done["stdout"] + done["stderr"]).strip()
            # a background exec names the proxy too
            started = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                 command="sleep 1; " + _ask("http://beyond.rift.test:8080/",
                                                            "beyond.rift.test:8080"),
                                 timeout_s=60, wait_s=30)
            out["background"] = started["stdout"].strip()
            for _ in range(30):
                stats = (await call(s, "rift_vm_get", vm_id=vm["id"]))["vm"]["stats"]
                if stats and stats["cpu_pct"] is not None and (stats["net_rx_bytes"] or 0) > 0:
                    break
                await anyio.sleep(1)
            used.update(stats or {})
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S)
    print(f"\nwhat the allowlisted tiny guest got: {out}")
    after, counted = _refusals(real), _counters()
    status, body = out["listed"].splitlines()
    assert status.split()[1] == "200" and body == "hello from beyond", out
    assert out["environment"] == "http://10.0.2.2:3128 http://10.0.2.2:3128", out
    assert out["background"].splitlines()[-1] == "beyond", out
    for label in ("other name", "host header", "host itself"):
        assert out[label].startswith("HTTP/1.1 403"), (label, out)
    for label in ("direct", "host direct"):
        assert "beyond" not in out[label] and '"status"' not in out[label], out
        assert "refused" in out[label] or "reset" in out[label].lower(), out
    grew = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
    print(f"refusals counted in /metrics: {grew}")
    assert grew["not_listed"] >= 1 and grew["host_mismatch"] >= 1, grew  # other name; host
    assert grew["connect"] >= 2, grew  # direct, host direct
    assert counted["proxied_connect"] - counted_before["proxied_connect"] >= 2
    print(f"what it used: {used}")
    assert 0 <= used["cpu_pct"] <= 100 and used["memory_used_mib"] > 10, used
    assert used["net_rx_bytes"] > 0 and used["net_tx_bytes"] > 0, used


@long_form("test_an_allowlisted_tiny_guest_reaches_a_listed_name_through_the_proxy_and_"
           "nothing_else; the proxy's CONNECT and SNI checks: tests/integration/"
           "test_egress_proxy.py; pip, git, gcc and apt in `debian`: test_real_debian.py")
def test_an_allowlisted_debian_guest_reaches_listed_names_through_the_proxy_and_nothing_else(
        real: Server, beyond: str, tmp_path: Path) -> None:
    before, counted_before = _refusals(real), _counters()
    rift_port = int(real.url.rsplit(":", 1)[1])
    out: dict[str, str] = {}
    used: dict[str, Any] = {}
    allow = {"allow": ["beyond.rift.test", "*.pkgs.rift.test", "192.0.2.0/24"]}
    checks = {
        # what the environment's proxy takes to a listed name
        "curl": "curl -sS http://beyond.rift.test:8080/hello.txt",
        "curl https": "curl -sSk https://beyond.rift.test:8443/hello.txt",
        "pip": ("python3 -m venv /root/v && /root/v/bin/pip install -q --no-cache-dir "
                "--trusted-host beyond.rift.test "
                f"--index-url http://beyond.rift.test:8080/simple/ {WHEEL_MODULE} && "
                f"/root/v/bin/python -c 'import {WHEEL_MODULE}; "
                f"print({WHEEL_MODULE}.GREETING)'"),
        "git": "git clone -q http://beyond.rift.test:8080/repo.git /root/r && cat /root/r/README",
        "apt": ("echo 'deb [trusted=yes] http://beyond.rift.test:8080/apt ./' "
                "> /etc/apt/sources.list.d/beyond.list && "
                "apt-get -q -o Dir::Etc::sourcelist=/etc/apt/sources.list.d/beyond.list "
                "-o Dir::Etc::sourceparts=- update >/dev/null 2>&1; "
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q rift-hello >/dev/null "
                "2>&1; rift-hello"),
        "environment": "echo $http_proxy $https_proxy",
        # what the proxy refuses
        "other name": "curl -sS -o /dev/null -w '%{http_code}' http://other.rift.test:8080/",
        "host header": ("curl -sS -o /dev/null -w '%{http_code}' -H 'Host: evil.rift.test' "
                        "http://beyond.rift.test:8080/"),
        "host itself": (f"curl -sS -o /dev/null -w '%{{http_code}}' "
                        f"http://10.0.2.2:{rift_port}/healthz"),
        "sni right": "python3 /root/tunnel.py beyond.rift.test",
        "sni wrong": "python3 /root/tunnel.py evil.rift.test",
        # what the firewall refuses: around the proxy, even as root
        "direct": ("unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY; curl -sS -m 5 "
                   f"http://{BEYOND}:8080/hello.txt 2>&1; echo exit=$?"),
        "host direct": (f"curl -sS -m 5 --noproxy '*' http://10.0.2.2:{rift_port}/healthz "
                        "2>&1; echo exit=$?"),
        "dns": "python3 /root/dns.py",
    }

    async def scenario() -> None:
        async with mcp_session(real.url, real.token) as s:
            handle, vm = await _allowlisted(s, "debian", allow)
            for path, text in (("/root/tunnel.py", TUNNEL), ("/root/dns.py", DNS)):
                await call(s, "rift_vm_write_file", handle=handle, vm_id=vm["id"], path=path,
                           content=text)
            for label, command in checks.items():
                done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                  command=command, timeout_s=240, wait_s=240)
                out[label] = (done["stdout"] + done["stderr"]).strip()
            # a background exec names the proxy too
            started = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                 command="sleep 1; curl -sS http://beyond.rift.test:8080/",
                                 timeout_s=60, wait_s=30)
            out["background"] = started["stdout"].strip()
            # what it used, from libvirt and its own counters (pip, git and apt came in)
            for _ in range(60):
                stats = (await call(s, "rift_vm_get", vm_id=vm["id"]))["vm"]["stats"]
                if stats and stats["cpu_pct"] is not None and (stats["net_rx_bytes"] or 0) > 50_000:
                    break
                await anyio.sleep(1)
            used.update(stats or {})
            await call(s, "rift_task_close", handle=handle)

    run(scenario, 900)
    print(f"\nwhat the allowlisted guest got: {out}")
    after, counted = _refusals(real), _counters()
    assert out["curl"] == out["curl https"] == "hello from beyond", out
    assert out["pip"] == WHEEL_GREETING, out
    assert out["git"] == "cloned through the egress proxy", out
    assert out["apt"] == DEB_GREETING, out
    assert out["environment"] == "http://10.0.2.2:3128 http://10.0.2.2:3128", out
    assert out["background"] == "beyond", out
    assert out["other name"] == out["host header"] == out["host itself"] == "403", out
    assert out["sni right"].splitlines() == ["HTTP/1.1 200 Connection established",
                                             "hello from beyond"], out
    lines = out["sni wrong"].splitlines()
    assert lines[0] == "HTTP/1.1 200 Connection established" and lines[1].startswith("ended:")
    for label in ("direct", "host direct"):
        assert "exit=0" not in out[label] and "beyond" not in out[label], out
        assert '"status"' not in out[label], out
    assert out["dns"].splitlines() == ["no answer from 10.0.2.3", "no answer from 10.213.0.2"]
    grew = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
    print(f"refusals counted in /metrics: {grew}")
    assert grew["not_listed"] >= 2 and grew["host_mismatch"] >= 1, grew  # other name; host
    assert grew["sni_mismatch"] >= 1, grew
    assert grew["connect"] >= 2 and grew["dns"] >= 2, grew
    assert counted["proxied_connect"] - counted_before["proxied_connect"] >= 2
    print(f"what it used: {used}")
    assert 0 <= used["cpu_pct"] <= 100 and used["memory_used_mib"] > 100, used
    assert used["disk_used_bytes"] > 1 << 20, used  # its overlay took what apt and pip wrote
    assert used["net_rx_bytes"] > 50_000 and used["net_tx_bytes"] > 1_000, used


# The deny test's namespace's server: says which of its addresses was asked.
_SAYS_ADDRESS = """
import http.server
class Says(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("at " + self.connection.getsockname()[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Says).serve_forever()
"""


@pytest.fixture(scope="module")
def deny_targets() -> Iterator[list[str]]:
    """Listeners in a network namespace of the test's own at ALLOWED, OPERATOR_DENIED
    (inside RIFT_EGRESS_DENY) and LINK_LOCAL, each answering `at <address>` on 8080;
    each answers this host (the test) before any guest asks."""
    targets = [ALLOWED, OPERATOR_DENIED, LINK_LOCAL]
    with namespace("deny", "10.213.7.1/24",
                   [f"{ALLOWED}/24", f"{OPERATOR_DENIED}/24", f"{LINK_LOCAL}/32"],
                   routes=(f"{LINK_LOCAL}/32",)) as ns, serving(ns, _SAYS_ADDRESS):
        for address in targets:
            for _ in range(100):
                try:
                    got = httpx.get(f"http://{address}:8080/", timeout=1).text
                    assert got == f"at {address}", got
                    break
                except httpx.HTTPError:
                    threading.Event().wait(0.1)
            else:
                pytest.fail(f"the namespace's server did not answer at {address}")
        yield targets


def test_an_open_guest_is_refused_link_local_and_the_operators_deny_list_and_reaches_the_rest(
        real: Server, deny_targets: list[str]) -> None:
    before, counted_before = _refusals(real), _counters()
    seen: dict[str, str] = {}

    async def scenario() -> None:
        async with mcp_session(real.url, real.token) as s:
            handle = (await call(s, "rift_task_new", name="deny"))["handle"]
            vm = (await call(s, "rift_vm_new", handle=handle, image="tiny",
                             egress="open"))["vm"]
            assert vm["egress"] == "open" and vm["status"] == "running", vm
            for address in deny_targets:
                command = FETCH.format(address=address, port=8080, path="")
                done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm["id"],
                                  command=command, timeout_s=30, wait_s=30)
                seen[address] = done["stdout"]
            await call(s, "rift_task_close", handle=handle)

    run(scenario, LIMIT_S)
    print(f"\nwhat the open guest's nc got: {seen}")
    assert seen[ALLOWED].startswith(f"at {ALLOWED}"), seen
    for address in (OPERATOR_DENIED, LINK_LOCAL):
        assert "at " not in seen[address] and "refused" in seen[address], (address, seen)
    # refused by the deny sets (their counter, and /metrics), not missed
    assert _counters()["denied"] - counted_before.get("denied", 0) >= 2
    after = _refusals(real)
    assert after.get("egress_deny", 0) - before.get("egress_deny", 0) >= 2, after
    listed = subprocess.run(["nft", "list", "set", "inet", "rift_guests", "deny_v4"],
                            capture_output=True, text=True, check=True).stdout
    assert DENIED_CIDR in listed and "169.254.0.0/16" in listed, listed
