"""The `python` image (SPEC §20) on a real guest, in make soak only (its cold build
installs ipykernel, numpy, pandas and matplotlib from .debs in a `debian` guest
under TCG: minutes; make test runs code in `debian` on rift-code's own kernel,
tests/e2e/test_real_debian.py, and ipykernel on the host,
tests/unit/test_code_server.py). The image is built as an operator builds it,
`rift image build python`: its recipe (hypervisor/python.Recipe) by Rift's
builder, the .debs fetched by the host's apt, nothing fetched by the guest; it is
cached machine-wide beside the tests' `debian` and built again only when its
recipe, its .debs or `debian` changed (tests.support.servers.cached_python, which
`make bench BENCH=code` shares). Then a VM of it from its pool runs code in
ipykernel at once, and through the MCP SDK client: state kept, a pandas table with
its HTML form, a matplotlib line chart that comes as an MCP image, a kernel that
dies (`os._exit`) restarted on the next run, a timeout that leaves the context, a
pause and a fork that keep the contexts, and a fork of a snapshot that lists them
before it runs anything. Its figures (`-o log_cli=true`): a `run_code("1+1")`
round trip against `rift_vm_exec` of `python3 -c 1+1`, the first run against a
later one, and the chart's round trip.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import pytest

from tests.support.mcp_clients import call, mcp_session, run
from tests.support.pools import fill_pool
from tests.support.real_guests import RealSettings
from tests.support.servers import Server, cached_python, real_vms_missing
from tests.support.soak import long_form

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

BUILD_S = 3600  # a cold install of the data stack's 149 .debs under TCG, 2 shared cores
BOOT_S = 180
LOG = logging.getLogger(__name__)


def _seed_python(data_dir: Path) -> None:
    images = data_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    (images / "python").symlink_to(cached_python(), target_is_directory=True)


REAL = RealSettings(debian=True, env={"RIFT_VM_BOOT_TIMEOUT_S": str(BOOT_S)},
                    prepare=_seed_python)
CHART = """
import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3))
plt.plot([1, 2, 3, 4], [1, 4, 9, 16])
plt.title("squares")
plt.show()
"""


@long_form("tests/e2e/test_real_debian.py runs code on rift-code's own kernel; "
           "tests/unit/test_code_server.py runs ipykernel on the host")
@pytest.mark.timeout(BUILD_S + 900)
def test_a_python_vm_runs_pandas_and_a_chart_in_ipykernel(real: Server) -> None:
    fill_pool(real, "python")
    took: dict[str, float] = {}

    async def scenario() -> None:
        async with mcp_session(real.url, real.token, "claude-code") as s:
            handle = (await call(s, "rift_task_new", name="python"))["handle"]
            vm = (await call(s, "rift_vm_new", handle=handle, image="python"))["vm"]
            assert (vm["status"], vm["start"]["kind"]) == ("running", "pool"), vm
            vm_id = vm["id"]

            async def code(text: str, **more: object) -> dict[str, object]:
                out = await call(s, "rift_vm_run_code", handle=handle, vm_id=vm_id,
                                 code=text, wait_s=600, **more)
                return dict(out["execution"])

            started = time.monotonic()
            first = await code("import pandas as pd\nx = 41\nlen(Out), '_1' in globals()")
            took["first run_code (server and ipykernel start)"] = time.monotonic() - started
            assert first["status"] == "ok", first
            # the fill's warm-up cells left no trace: no count, no output kept
            assert first["execution_count"] == 1, first
            assert first["results"][0]["data"]["text/plain"] == "(0, False)", first  # type: ignore[index]
            table = await code("pd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
            [main] = table["results"]  # type: ignore[misc]
            assert main["is_main_result"] and "<table" in main["data"]["text/html"], table
            listed = (await call(s, "rift_vm_code_context_list", handle=handle,
                                 vm_id=vm_id))["contexts"]
            assert listed[0]["backend"] == "ipykernel", listed

            rounds = []
            for _ in range(5):
                started = time.monotonic()
                two = await code("1+1")
                rounds.append(time.monotonic() - started)
                assert two["results"][0]["data"]["text/plain"] == "2"  # type: ignore[index]
            execs = []
            for _ in range(5):
                started = time.monotonic()
                done = await call(s, "rift_vm_exec", handle=handle, vm_id=vm_id,
                                  command="python3 -c 1+1")
                execs.append(time.monotonic() - started)
                assert done["exit_code"] == 0, done
            took["run_code 1+1 (median of 5)"] = statistics.median(rounds)
            took["exec python3 -c 1+1 (median of 5)"] = statistics.median(execs)

            started = time.monotonic()
            result = await s.call_tool("rift_vm_run_code", {
                "handle": handle, "vm_id": vm_id, "code": CHART, "wait_s": 600})
            took["matplotlib line chart to PNG"] = time.monotonic() - started
            assert not result.is_error, result.content
            images = [c for c in result.content if c.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png", result.content
            assert len(images[0].data) > 1000

            died = await code("import os; os._exit(1)")
            assert died["status"] == "kernel_died", died
            again = await code("'x' in globals()")
            assert again["results"][0]["data"]["text/plain"] == "False", again  # type: ignore[index]
            await code("y = 5")
            stuck = await code("import time\nwhile True: time.sleep(0.1)", timeout_s=3)
            assert stuck["status"] == "timed_out", stuck
            kept = await code("y")
            assert kept["results"][0]["data"]["text/plain"] == "5", kept  # type: ignore[index]
            # The contexts are the guest's memory: a pause keeps them, a fork starts with them.
            await call(s, "rift_vm_pause", handle=handle, vm_id=vm_id)
            await call(s, "rift_vm_resume", handle=handle, vm_id=vm_id)
            resumed = await code("y * 2")
            assert resumed["results"][0]["data"]["text/plain"] == "10", resumed  # type: ignore[index]
            [fork] = (await call(s, "rift_vm_fork", handle=handle, vm_id=vm_id))["vms"]
            forked = (await call(s, "rift_vm_run_code", handle=handle, vm_id=fork["id"],
                                 code="y + 1", wait_s=600))["execution"]
            assert forked["results"][0]["data"]["text/plain"] == "6", forked
            # A fork of a snapshot lists the contexts the source had then, before any run.
            snap = (await call(s, "rift_vm_snapshot", handle=handle, vm_id=vm_id))["snapshot"]
            [child] = (await call(s, "rift_vm_fork", handle=handle,
                                  snapshot_id=snap["id"]))["vms"]
            assert [x["id"] for x in child["code_contexts"]] == ["default"], child
            await call(s, "rift_vm_destroy", handle=handle, vm_id=fork["id"])
            inherited = (await call(s, "rift_vm_run_code", handle=handle, vm_id=child["id"],
                                    code="y + 2", wait_s=600))["execution"]
            assert inherited["results"][0]["data"]["text/plain"] == "7", inherited
            await call(s, "rift_task_close", handle=handle)

    run(scenario, limit_s=900)
    assert real.rift("pool", "clear", "python").returncode == 0
    for what, seconds in took.items():
        LOG.info("%s: %.3f s", what, seconds)
    ratio = took["run_code 1+1 (median of 5)"] / took["exec python3 -c 1+1 (median of 5)"]
    LOG.info("run_code 1+1 against exec python3 -c 1+1: %.2fx", ratio)
