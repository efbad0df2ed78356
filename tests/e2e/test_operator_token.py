"""An operator's token (`rift token new USER --operator`) against a real `rift
serve` on libvirt's test driver: made by the command, it works on every door like
any token, and only it reads /metrics' series that name VMs and tasks."""

from __future__ import annotations

import re
import time

import httpx

from rift.domain import usage
from rift.store.sql import SqlStore
from tests.support.mcp_clients import WAIT_S, call, mcp_session, run
from tests.support.servers import Server


def _record_usage(server: Server, vm_id: str) -> None:
    """A sample of the VM's use, written as rift.services.background.usage writes it (libvirt's
    test driver, under this server, reports no figures)."""
    store = SqlStore(f"sqlite:///{(server.data_dir / 'rift.db').resolve()}")
    try:
        with store.write() as tx:
            vm = tx.vms.get(vm_id)
            assert vm is not None
            stats = usage.advance(vm.stats, usage.Sample(
                at=time.time(), cpu_time_ns=10**9, memory_rss_kib=65536,
                disk_allocation_bytes=None), vm.vcpus)
            assert tx.vms.record_stats(vm_id, stats)
    finally:
        store.close()


def _metrics(server: Server, token: str) -> str:
    answer = httpx.get(server.url + "/metrics", timeout=WAIT_S,
                       headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return answer.text


def test_an_operators_token_works_on_every_door_and_alone_sees_vm_series(
        server: Server) -> None:
    made = server.rift("token", "new", "admin", "--label", "prometheus", "--operator")
    assert made.returncode == 0, made.stderr
    operator = made.stdout.strip()

    async def scenario() -> tuple[str, str]:
        async with mcp_session(server.url, operator, "ops-console") as session:
            opened = await call(session, "rift_task_new", name="watched")
            assert opened["task"]["holder"] == "mcp:ops-console"
            vm = await call(session, "rift_vm_new", handle=opened["handle"])
            return opened["task"]["id"], vm["vm"]["id"]

    task_id, vm_id = run(scenario)
    rest = httpx.get(server.url + "/api/v1/tasks", timeout=WAIT_S,
                     headers={"Authorization": f"Bearer {operator}"})
    assert rest.status_code == 200 and task_id in rest.text
    _record_usage(server, vm_id)
    seen = _metrics(server, operator)
    assert re.search(rf'rift_vm_\w+\{{[^}}]*vm="{vm_id}"', seen), seen
    plain = _metrics(server, server.token)  # the token `rift serve` printed: no operator
    assert "rift_running_vms " in plain
    assert vm_id not in plain and task_id not in plain and "rift_vm_cpu_percent" not in plain
