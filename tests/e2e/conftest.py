"""A real `rift serve` (uvicorn on a loopback port) on libvirt's test driver."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hypervisor import write_test_host_xml


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
    port = free_port()
    uri = write_test_host_xml(str(tmp / "node.xml"), 64, 262144)
    env = dict(os.environ, RIFT_DATA_DIR=str(tmp / "data"), RIFT_HYPERVISOR_URI=uri,
               **env_extra)
    log = tmp / "server.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rift.cli", "serve", "--port", str(port)],
            stdout=subprocess.PIPE, stderr=sink, env=env, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    password = re.search(r"password: (\S+)", lines[1])
    token = re.search(r"token:\s+(rift_\S+)", lines[2])
    assert password and token, lines
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("rift serve did not answer /healthz within 30 s")
    return proc, Server(url, token.group(1), password.group(1), tmp / "data", env, log)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(tmp_path_factory.mktemp("rift"))
    try:
        yield srv
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)
    if proc.stdout is not None:
        proc.stdout.close()
