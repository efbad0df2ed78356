"""A build's VM of a layer keeps its layer's host key (rift.guest.scripts.
same_host_key_script): `rift-exec identity` is given the MAC, fresh entropy and the
clock, empty key lines (the key stays), no pid file and no restart command, so the
guest's SSH server is not started anew; a fork's full identity gives a key and a
restart after RIFT_SETTLE_MS."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hypervisor.exec_helper import GUEST_PATH
from rift.guest.scripts import identity_script, same_host_key_script

FAKE_EXEC = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
cat > "$(dirname "$0")/stdin"
"""


def _run(tmp_path: Path, script: str) -> tuple[list[str], str]:
    fake = tmp_path / "rift-exec"
    fake.write_text(FAKE_EXEC)
    fake.chmod(0o755)
    done = subprocess.run(["/bin/sh", "-c", script.replace(GUEST_PATH, str(fake))],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return (tmp_path / "argv").read_text().splitlines(), (tmp_path / "stdin").read_text()


def test_a_layers_vm_gets_mac_entropy_and_clock_but_keeps_its_key_and_ssh_server(
        tmp_path: Path) -> None:
    argv, stdin = _run(tmp_path, same_host_key_script("52:54:00:aa:bb:cc", b"\x01" * 32,
                                                       1_700_000_000.5))
    # DIR MAC NOW_CS SETTLE_MS KEY PIDFILE, and no `-- RESTART...`
    assert argv[0] == "identity" and argv[3:] == ["170000000050", "0", "/run/rift-no-key", "-"]
    assert stdin == "01" * 32 + "\n\n\n"  # the entropy line, then empty key lines


@pytest.mark.skipif(Path("/run/dropbear.pid").exists(), reason="this host runs dropbear")
def test_a_forks_identity_gives_a_new_key_and_restarts_the_ssh_server(
        tmp_path: Path) -> None:
    argv, stdin = _run(tmp_path, identity_script("52:54:00:aa:bb:cc", b"\x01" * 32,
                                                 1_700_000_000.5))
    assert argv[0] == "identity" and argv[4] == "2500"  # RIFT_SETTLE_MS
    assert argv[5] == "/etc/ssh/ssh_host_ed25519_key"
    lines = stdin.split("\n")
    assert lines[0] == "01" * 32 and lines[1].startswith("ssh-ed25519 ")
