"""The `rift` command on SQLite and libvirt's test driver."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hypervisor import write_test_host_xml
from rift.bootstrap import build_deps, close_deps
from rift.cli import main
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.services.access import accounts
from rift.services.lifecycle import tasks, vms


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    uri = write_test_host_xml(str(tmp_path / "node.xml"), 8, 8192)
    monkeypatch.setenv("RIFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RIFT_HYPERVISOR_URI", uri)
    return Settings()


def rift(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_users_and_tokens_are_made_listed_and_revoked(env: Settings,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("correct horse battery\n"))
    assert rift(capsys, "user", "add", "alice", "--password-stdin")[0] == 0
    code, out, _ = rift(capsys, "user", "list", "--json")
    assert code == 0 and json.loads(out)[0]["name"] == "alice"
    code, out, _ = rift(capsys, "token", "new", "alice", "--label", "laptop")
    token = out.strip()
    assert code == 0 and re.fullmatch(r"rift_[A-Za-z0-9_-]{43}", token), out
    code, out, _ = rift(capsys, "token", "list", "alice", "--json")
    listed = json.loads(out)
    assert listed[0]["label"] == "laptop" and token not in out
    assert listed[0]["operator"] is False
    code, out, _ = rift(capsys, "token", "new", "alice", "--label", "prometheus", "--operator")
    operator_token = out.strip()
    assert code == 0 and re.fullmatch(r"rift_[A-Za-z0-9_-]{43}", operator_token), out
    code, out, _ = rift(capsys, "token", "list", "alice")
    assert re.search(r"prometheus\s+True", out) and re.search(r"laptop\s+False", out), out
    deps = build_deps(env)
    try:
        assert accounts.authenticate(deps, token)[1].label == "api:laptop"
        assert accounts.authenticate(deps, token)[1].operator is False
        assert accounts.authenticate(deps, operator_token)[1].operator is True
        assert accounts.verify_password(deps, "alice", "correct horse battery")
        assert not accounts.verify_password(deps, "alice", "wrong")
        assert rift(capsys, "token", "revoke", listed[0]["id"])[0] == 0
        with pytest.raises(Exception, match="token"):
            accounts.authenticate(deps, token)
    finally:
        close_deps(deps)
    code, _, err = rift(capsys, "token", "new", "nobody")
    assert code == 1 and err.startswith("invalid_argument")


def test_the_operator_lists_shows_and_closes_tasks(env: Settings,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    deps = build_deps(env)
    try:
        accounts.add_user(deps, "bob")
        _, caller = accounts.authenticate(deps, accounts.new_token(deps, "bob", "ci").token.value)
        opened = tasks.new(deps, caller, command(c.TaskNewIn, name="nightly"))
        vm = vms.new(deps, caller, command(c.VmNewIn, handle=str(opened.handle))).vm
    finally:
        close_deps(deps)
    task_id = opened.task.id
    code, out, _ = rift(capsys, "tasks")
    assert code == 0 and task_id in out and "api:ci" in out and "HOLDER" in out
    code, out, _ = rift(capsys, "tasks", "--json")
    assert json.loads(out)[0]["vms"][0]["id"] == vm.id
    code, out, _ = rift(capsys, "task", "show", task_id)
    assert json.loads(out)["name"] == "nightly"
    code, out, _ = rift(capsys, "task", "close", task_id)
    assert code == 0 and "destroyed 1" in out
    code, out, _ = rift(capsys, "task", "show", task_id)
    assert json.loads(out)["close_reason"] == "operator"
    assert rift(capsys, "tasks")[1].count("task_") == 0
    assert task_id in rift(capsys, "tasks", "--all")[1]
    code, _, err = rift(capsys, "task", "close", task_id)
    assert code == 1 and err.startswith("task_closed")
    code, _, err = rift(capsys, "task", "show", "task_aaaaaaaa")
    assert code == 1 and err.startswith("task_not_found")


def test_hosts_are_added_listed_drained_and_removed(env: Settings, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    second = write_test_host_xml(str(tmp_path / "second.xml"), 4, 2048)
    assert rift(capsys, "host", "add", "second", second)[0] == 0
    code, out, _ = rift(capsys, "host", "list", "--json")
    rows = {h["name"]: h for h in json.loads(out)}
    assert rows["second"]["memory_mib"] == 2048 and rows["second"]["vcpus"] == 16  # 4 x 4
    assert rows["local"]["vcpus"] == 8 * 4  # libvirt says 8 CPUs; RIFT_CPU_OVERCOMMIT is 4
    assert rift(capsys, "host", "add", "third", "test:///default", "--vcpus", "2",
                "--memory-mib", "512")[0] == 0
    assert rift(capsys, "host", "drain", "second")[0] == 0
    code, out, _ = rift(capsys, "host", "list")
    assert "drained" in out and "STATE" in out
    assert rift(capsys, "host", "remove", "third")[0] == 0
    code, _, err = rift(capsys, "host", "remove", "nowhere")
    assert code == 1 and "rift host list" in err


def test_images_and_doctor_report_what_is_here(env: Settings,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = rift(capsys, "image", "list", "--json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["debian", "tiny"]
    code, out, _ = rift(capsys, "doctor")
    assert "libvirt" in out and "database" in out and "kvm" in out
    assert re.search(r"ok\s+libvirt\s+test:", out), out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_creates_the_admin_once_and_answers_healthz(env: Settings) -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "rift.cli", "serve", "--port", str(port)]
    outputs = []
    for _ in range(2):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ), text=True)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            else:
                pytest.fail("rift serve did not answer /healthz in 30 s")
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
        outputs.append(out)
    assert "password:" in outputs[0] and re.search(r"token:\s+rift_", outputs[0])
    assert "password:" not in outputs[1]
