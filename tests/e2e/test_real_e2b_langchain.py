"""LangChain's E2B integration (`langchain-e2b`, the Deep Agents sandbox backend,
pinned in pyproject's dev extras), used unchanged, runs code in a Rift VM (SPEC §16,
issue #28): only E2B's settings (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`)
point at `rift serve`. It is built on the plain `e2b` SDK (`Sandbox.create`,
`commands.run`, `files`), not e2b-code-interpreter's `run_code`. The sandbox is a
`debian` VM (E2B's `user`, `/home/user`, python3): the backend's default working
folder and its Python-scripted file tools work as on E2B."""

from __future__ import annotations

import pytest
from e2b import Sandbox
from langchain_e2b import E2BSandbox

from tests.support.e2b import Door, e2b_opts
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import real_vms_missing

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

REAL = RealSettings(env={"RIFT_DEFAULT_IMAGE": "debian", "RIFT_VM_BOOT_TIMEOUT_S": "240"},
                    debian=True)


@pytest.mark.timeout(600)  # a cold boot of `debian` under TCG on a busy host, then ~15 calls
def test_the_deep_agents_e2b_backend_runs_code_and_files_in_a_rift_vm(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = rig.server
    for name in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.setenv(name, srv.url + "/e2b")
    monkeypatch.setenv("E2B_API_KEY", srv.token)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    sandbox = Sandbox.create(timeout=600, request_timeout=300)
    try:
        backend = E2BSandbox(sandbox=sandbox)
        ran = backend.execute("python3 -c 'import os; print(6 * 7, os.getcwd())'; whoami")
        assert (ran.exit_code, ran.output) == (0, "42 /home/user\nuser\n")
        failed = backend.execute("echo oops >&2; exit 3")
        assert (failed.exit_code, failed.output) == (3, "oops\n")

        assert backend.write("/home/user/app/hello.py", "print('hello from rift')\n").error \
            is None
        assert backend.execute("python3 app/hello.py").output == "hello from rift\n"
        edited = backend.edit("/home/user/app/hello.py", "from rift", "from a rift VM")
        assert (edited.error, edited.occurrences) == (None, 1)
        read = backend.read("/home/user/app/hello.py")
        assert read.error is None and read.file_data is not None
        assert "print('hello from a rift VM')" in str(read.file_data["content"])
        listed = backend.ls("/home/user/app")
        assert listed.entries is not None
        assert [(e["path"], e["is_dir"]) for e in listed.entries] == \
            [("/home/user/app/hello.py", False)]

        [up] = backend.upload_files([("/tmp/data.bin", bytes(range(256)) * 4)])
        assert up.error is None
        [down, missing] = backend.download_files(["/tmp/data.bin", "/tmp/none"])
        assert (down.error, down.content) == (None, bytes(range(256)) * 4)
        assert (missing.error, missing.content) == ("file_not_found", None)
        # underneath, a Rift VM of `debian` in a task of its own held by the E2B door
        door = Door(srv, e2b_opts(srv.url, srv.token))
        assert door.vm(sandbox)["image"] == "debian"
        assert door.task(sandbox)["holder"].startswith("e2b:")
    finally:
        sandbox.kill()
