"""The recipe examples of docs/examples built on real guests that reach no mirror
(SPEC §19), in make soak only (a cold build installs hundreds of Debian packages
under TCG: minutes). `docs/examples/node` is built by `rift image build node
--recipe … --debs "nodejs npm"`: the host's apt fetches the .debs (cached
machine-wide), the guest installs them from its context, `node server.js` is
started and saved running; a VM from the image's pool answers at once through an
exposure. Nothing is fetched by a guest. The `python` image's recipe is
tests/e2e/test_real_python.py's."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.mcp_clients import call, mcp_session, run
from tests.support.pools import fill_pool
from tests.support.real_guests import RealSettings
from tests.support.servers import Server, real_vms_missing
from tests.support.soak import long_form

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]
BUILD_S = 1800  # a cold install of nodejs and npm's 362 packages on a shared 2-core machine
LIMIT_S = 300
LOG = logging.getLogger(__name__)  # the figures, for -o log_cli=true
REAL = RealSettings(debian=True, env={"RIFT_VM_BOOT_TIMEOUT_S": "180"})


def build_image(srv: Server, *argv: str) -> subprocess.CompletedProcess[str]:
    """`rift image build ARGV` against `srv`'s store, in its own process."""
    return subprocess.run([sys.executable, "-m", "rift.cli", "image", "build", *argv],
                          env=srv.env, capture_output=True, text=True, timeout=BUILD_S,
                          check=False)


@long_form("tests/unit/test_debs.py (the .debs' set and the context with them); "
           "tests/e2e/test_real_forks.py (a tiny recipe with a CMD, its VM answering)")
@pytest.mark.timeout(BUILD_S + 2 * LIMIT_S)
def test_the_node_example_builds_offline_and_its_pooled_vm_answers_through_an_exposure(
        real: Server) -> None:
    example = ROOT / "docs" / "examples" / "node"
    began = time.monotonic()
    built = build_image(real, "node", "--recipe", str(example / "Recipe"), "--context",
                        str(example), "--debs", "nodejs npm")
    built_s = time.monotonic() - began
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr
    assert "port 8080 answers" in built.stdout, built.stdout[-4000:]
    fill_pool(real, "node")

    async def use_image() -> float:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="node"))["handle"]
            started = time.monotonic()
            vm = (await call(s, "rift_vm_new", handle=handle, image="node"))["vm"]
            assert (vm["status"], vm["start"]["kind"]) == ("running", "pool"), vm
            url = (await call(s, "rift_vm_expose", handle=handle, vm_id=vm["id"],
                              port=8080))["exposure"]["url"]
            async with httpx.AsyncClient(timeout=30) as http:
                got = await http.get(url.rstrip("/") + "/hello")  # serving already: no retry
            answered = time.monotonic() - started
            assert got.status_code == 200, got.text
            body = got.json()
            assert body["path"] == "/hello" and body["node"].startswith("v18."), body
            await call(s, "rift_task_close", handle=handle)
            return answered

    answered_s = run(use_image, LIMIT_S)
    assert real.rift("pool", "clear", "node").returncode == 0
    LOG.info("node: built in %.1f s; a pooled VM answered through its exposure %.2f s "
             "after rift_vm_new", built_s, answered_s)
