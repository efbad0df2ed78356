"""The Boxes page's benchmark (issue #5): the page's server time with 500 open
tasks of 3 VMs each, against the same 500 tasks as JSON from the REST list.

Like with like: both go through the same app (`create_app`, SQLite in WAL mode,
libvirt's test driver) in process, over Starlette's TestClient, so routing,
middleware, authentication (a session cookie; a bearer token), the store reads
and the rendering are all counted, and neither pays for a socket. The REST list
pages at 100 (its maximum), so "the same data as JSON" is the five requests
that walk `next_after` through all 500 tasks; their times are summed.
Interleaved blocks, so a noisy neighbour hits both alike; medians and the
ratio (target: the page at most 3x the JSON route).
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from starlette.testclient import TestClient

from bench.common import print_table, work_dir
from hypervisor import write_test_host_xml
from rift.app import create_app
from rift.bootstrap import build_deps, close_deps, ensure_admin
from rift.config import Settings
from rift.domain.ids import new_task_id, new_vm_id
from rift.domain.model import Task, Vm
from rift.services.access import sessions
from rift.services.context import Deps
from rift.services.read import boxes
from web import render
from web.security import SESSION_COOKIE

TASKS = 500
VMS_PER_TASK = 3
BLOCKS = 15
PER_BLOCK = 4
TARGET_RATIO = 3.0


def fill(deps: Deps, owner: str) -> None:
    """500 open tasks of 3 running VMs, written straight through the store."""
    start = datetime.now(UTC) - timedelta(hours=1)
    with deps.store.write() as tx:
        for i in range(TASKS):
            at = start + timedelta(seconds=i)
            task = Task(id=new_task_id(), owner=owner, name=f"task number {i} of the bench",
                        status="open", lease_gen=1, secret_digest="0" * 64,
                        holder="mcp:claude-code", held_since=at, last_activity_at=at,
                        created_at=at)
            tx.tasks.add(task)
            for j in range(VMS_PER_TASK):
                tx.vms.add(Vm(id=new_vm_id(), task_id=task.id, owner=owner, name=f"vm-{j}",
                              image="tiny", status="running", host="local", vcpus=1,
                              memory_mib=256, created_at=at, ready_at=at))


def page_once(client: TestClient) -> float:
    start = time.perf_counter()
    answer = client.get("/")
    elapsed = time.perf_counter() - start
    assert answer.status_code == 200 and answer.text.count('class="task"') == TASKS
    return elapsed


def json_once(client: TestClient, token: str) -> float:
    headers = {"Authorization": f"Bearer {token}"}
    seen, after, elapsed = 0, None, 0.0
    while True:
        params = {"limit": "100", **({"after": after} if after else {})}
        start = time.perf_counter()
        answer = client.get("/api/v1/tasks", params=params, headers=headers)
        elapsed += time.perf_counter() - start
        body = answer.json()
        seen += len(body["tasks"])
        after = body["next_after"]
        if after is None:
            break
    assert seen == TASKS
    return elapsed


def measure(data_dir: Path) -> list[tuple[str, ...]]:
    uri = write_test_host_xml(str(data_dir / "node.xml"), 64, 262144)
    settings = Settings(data_dir=data_dir, hypervisor_uri=uri, log_level="WARNING",
                        max_open_tasks=10_000)
    deps = build_deps(settings)
    try:
        first = ensure_admin(deps)
        assert first is not None
        fill(deps, "admin")
        made = sessions.log_in(deps, "admin", first.password, "bench", 3600)
        pages: list[float] = []
        lists: list[float] = []
        with TestClient(create_app(settings, deps), follow_redirects=False) as client:
            client.cookies.set(SESSION_COOKIE, made.session_id)
            for _ in range(3):  # warm up: templates compiled, statements cached
                page_once(client)
                json_once(client, first.token)
            for _ in range(BLOCKS):
                pages.extend(page_once(client) for _ in range(PER_BLOCK))
                lists.extend(json_once(client, first.token) for _ in range(PER_BLOCK))
        read_s = [timed(lambda: boxes.read_page(deps, "admin")) for _ in range(20)]
        page = boxes.read_page(deps, "admin")
        now = deps.clock.now()
        render_s = [timed(lambda: render.boxes_page(page, now, {"mcp_url": "x"}, "t", 14400))
                    for _ in range(20)]
        tick_s = [timed(lambda: boxes.change_mark(deps)) for _ in range(200)]
    finally:
        close_deps(deps)
    page_ms, json_ms = ms(pages), ms(lists)
    ratio = page_ms / json_ms
    verdict = "ok" if ratio <= TARGET_RATIO else "over target"
    return [
        (f"GET / (the page, {TASKS} tasks x {VMS_PER_TASK} VMs, one request)", f"{page_ms:.1f} ms"),
        (f"GET /api/v1/tasks, the same {TASKS} tasks (5 pages of 100, summed)",
         f"{json_ms:.1f} ms"),
        ("page / JSON", f"{ratio:.2f} (target <= {TARGET_RATIO:.0f}: {verdict})"),
        ("  of the page: the store read (tasks, VMs, change mark)", f"{ms(read_s):.1f} ms"),
        ("  of the page: the Jinja2 render", f"{ms(render_s):.1f} ms"),
        ("live stream tick (the change-mark query)", f"{ms(tick_s) * 1000:.0f} µs"),
    ]


def timed(work: object) -> float:
    assert callable(work)
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    with work_dir("rift-bench-boxes-") as tmp:
        rows = measure(Path(tmp))
    print_table("The Boxes page (issue #5): server time, medians", rows, ("what", "figure"))


if __name__ == "__main__":
    main()
