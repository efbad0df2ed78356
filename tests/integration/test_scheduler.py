"""APScheduler runs the sweep on its interval, in the background."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from hypervisor import write_test_host_xml
from rift.bootstrap import build_deps, close_deps
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.scheduler import start_scheduler
from rift.services.lifecycle import tasks
from tests.support.engine import ALICE


def test_the_scheduler_closes_an_idle_task_within_a_few_intervals(tmp_path: Path) -> None:
    uri = write_test_host_xml(str(tmp_path / "node.xml"), 4, 4096)
    deps = build_deps(Settings(data_dir=tmp_path / "d", hypervisor_uri=uri, task_idle_s=3600))
    scheduler = start_scheduler(deps, interval_s=1)
    try:
        opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
        with deps.store.write() as tx:  # quiet since 2020
            task = tx.tasks.get(opened.task.id)
            assert task is not None
            quiet = replace(task, lease_gen=task.lease_gen + 1,
                            last_activity_at=task.last_activity_at.replace(year=2020))
            assert tx.tasks.save(quiet, expected_gen=task.lease_gen)
        deadline = time.monotonic() + 15
        status = "open"
        while status == "open" and time.monotonic() < deadline:
            time.sleep(0.2)
            status = tasks.get(deps, ALICE, command(c.TaskGetIn,
                         task_id=opened.task.id)).task.status
        view = tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=opened.task.id)).task
        assert (view.status, view.close_reason) == ("closed", "idle")
    finally:
        scheduler.shutdown(wait=True)
        close_deps(deps)
