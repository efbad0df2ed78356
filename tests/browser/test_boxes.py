"""The Boxes page in Chromium against a real `rift serve`: login, a task an MCP
client made, live changes without a reload (takeover, close, a pause, a
snapshot, the sweep, another replica, a VM's code contexts), another user's
tasks absent, hostile names as text, the session cookie, logout, and the
screenshot in the README and docs/agents.md."""

from __future__ import annotations

import json
import math
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from rift.domain import usage
from rift.domain.code_contexts import CodeContext
from rift.domain.ids import new_task_id
from rift.domain.model import NewEvent, Task
from rift.services.lifecycle import code_records
from rift.store.sql import SqlStore
from tests.support.browser import Agent, add_user, log_in, start_replica
from tests.support.servers import Server, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "boxes.png"


def card(page: Any, task_id: str) -> Any:
    return page.locator(f"#live article[data-task='{task_id}']")


def mark_page(page: Any) -> None:
    """A flag that a reload would lose: the page must keep it through live changes."""
    page.evaluate("window.__riftSamePage = true")


def same_page(page: Any) -> bool:
    return bool(page.evaluate("window.__riftSamePage === true"))


def test_a_task_an_mcp_client_made_shows_and_changes_live(server: Server, page: Any) -> None:
    agent = Agent(server.url, server.token, "claude-code")
    opened = agent.call("rift_task_new", name="refactor the parser")
    task_id = opened["task"]["id"]
    vm = agent.call("rift_vm_new", handle=opened["handle"], name="builder")["vm"]
    log_in(page, server.url, "admin", server.password)
    mark_page(page)
    task = card(page, task_id)
    expect(task.locator(".name")).to_have_text("refactor the parser")
    expect(task.locator(".holder")).to_have_text("mcp:claude-code")
    row = task.locator(f"tr[data-vm='{vm['id']}']")
    expect(row.locator("[data-h=Task]")).to_have_text(task_id)
    expect(row.locator("[data-h=Status]")).to_have_text("running")
    expect(row.locator("[data-h=Image]")).to_have_text("debian")  # RIFT_DEFAULT_IMAGE
    expect(row.locator("[data-h=Size]")).to_have_text("1 vCPU · 512 MiB")
    expect(row.locator("[data-h=Host]")).to_have_text("local")
    expect(row.locator("[data-h=Ports]")).to_have_text("none")
    exposed = agent.call("rift_vm_expose", handle=opened["handle"], vm_id=vm["id"],
                         port=5173)["exposure"]
    expect(row.locator("[data-h=Ports]")).to_have_text("5173")  # the port, never its URL
    assert exposed["url"].split("/x/")[1].strip("/") not in page.content()
    expect(task.locator(".activity time")).to_have_attribute("title", re.compile(r" UTC$"))

    taken = Agent(server.url, server.token, "cursor").call(
        "rift_task_attach", task_id=task_id, takeover=True)
    expect(task.locator(".holder")).to_have_text("mcp:cursor")

    Agent(server.url, server.token, "cursor").call("rift_task_close", handle=taken["handle"])
    closed = page.locator(f"#live .closed tr[data-task='{task_id}']")
    expect(closed.locator("[data-h=Reason]")).to_contain_text("closed")
    expect(task).to_have_count(0)
    assert same_page(page)
    assert opened["handle"] not in page.content() and taken["handle"] not in page.content()


def test_a_paused_vm_and_the_tasks_snapshots_show_live(server: Server, page: Any) -> None:
    agent = Agent(server.url, server.token, "claude-code")
    opened = agent.call("rift_task_new", name="park and branch")
    task_id, handle = opened["task"]["id"], opened["handle"]
    vm = agent.call("rift_vm_new", handle=handle, name="base", image="tiny")["vm"]
    log_in(page, server.url, "admin", server.password)
    mark_page(page)
    task = card(page, task_id)
    row = task.locator(f"tr[data-vm='{vm['id']}']")
    expect(row.locator("[data-h=Status]")).to_have_text("running")
    agent.call("rift_vm_pause", handle=handle, vm_id=vm["id"])
    expect(row.locator("[data-h=Status] .s-paused")).to_have_text("paused")
    agent.call("rift_vm_resume", handle=handle, vm_id=vm["id"])
    snap = agent.call("rift_vm_snapshot", handle=handle, vm_id=vm["id"],
                      name="known good")["snapshot"]
    shown = task.locator(f".snapshot[data-snapshot='{snap['id']}']")
    expect(shown).to_contain_text("known good")
    expect(shown).to_contain_text(vm["id"])
    agent.call("rift_vm_snapshot_delete", handle=handle, snapshot_id=snap["id"])
    expect(shown).to_have_count(0)
    assert same_page(page)
    agent.call("rift_task_close", handle=handle)


def record_usage(server: Server, vm_id: str, samples: list[tuple[float, int, int]]) -> None:
    """Samples of a VM's use written as rift.services.background.usage writes them ((when, CPU
    time in ns, resident KiB) each; libvirt's test driver, under this server, reports
    no figures), with the mark that tells the Boxes pages."""
    store = SqlStore(f"sqlite:///{(server.data_dir / 'rift.db').resolve()}")
    try:
        with store.write() as tx:
            vm = tx.vms.get(vm_id)
            assert vm is not None
            text = vm.stats
            for at, cpu_ns, rss in samples:
                text = usage.advance(text, usage.Sample(
                    at=at, cpu_time_ns=cpu_ns, memory_rss_kib=rss,
                    disk_allocation_bytes=None, net=(1000, 2000)), vm.vcpus)
            tx.vms.record_stats(vm_id, text)
            tx.meta.swap(usage.MARK_KEY, tx.meta.get(usage.MARK_KEY), str(samples[-1][0]))
    finally:
        store.close()


def test_a_vms_cpu_and_memory_show_as_small_charts_that_follow_it_live(
        server: Server, page: Any) -> None:
    agent = Agent(server.url, server.token, "claude-code")
    opened = agent.call("rift_task_new", name="busy")
    vm = agent.call("rift_vm_new", handle=opened["handle"], image="tiny")["vm"]
    log_in(page, server.url, "admin", server.password)
    mark_page(page)
    use = card(page, opened["task"]["id"]).locator(f"tr[data-vm='{vm['id']}'] [data-h=Use]")
    expect(use).to_have_text("–")  # nothing sampled yet
    start = time.time()
    # 10 s apart: 2.5 s of CPU (25% of its one vCPU), then 8 s (80%); 100 then 200 MiB
    record_usage(server, vm["id"], [(start, 0, 102400), (start + 10, 2_500_000_000, 102400),
                                    (start + 20, 10_500_000_000, 204800)])
    expect(use.locator(".use-cpu .use-now")).to_have_text("80%")
    expect(use.locator(".use-memory .use-now")).to_have_text("200 MiB")
    cpu_line = use.locator(".use-cpu svg polyline")
    expect(use.locator(".use-cpu svg")).to_have_attribute("aria-label",
                                                          "CPU over the last 3 samples")
    points = [tuple(map(float, p.split(","))) for p in
              cpu_line.get_attribute("points").split()]
    assert len(points) == 2 and points[1][1] < points[0][1], points  # 25% then 80%: up
    record_usage(server, vm["id"], [(start + 30, 10_600_000_000, 153600)])
    expect(use.locator(".use-cpu .use-now")).to_have_text("1%")
    expect(use.locator(".use-memory svg")).to_have_attribute("aria-label",
                                                             "memory over the last 4 samples")
    box = use.locator(".use-cpu svg").bounding_box()
    assert box is not None and box["width"] == 60 and box["height"] == 16
    assert same_page(page)
    seen = agent.call("rift_vm_get", vm_id=vm["id"])["vm"]["stats"]
    assert seen["cpu_pct"] == 1.0 and seen["memory_used_mib"] == 150, seen
    assert (seen["net_rx_bytes"], seen["net_tx_bytes"]) == (1000, 2000)
    agent.call("rift_task_close", handle=opened["handle"])


def record_contexts(server: Server, vm_id: str, now: datetime, status: str = "error",
                    own: bool = True) -> None:
    """A VM's code contexts as the engine records them (rift.services.lifecycle.
    code_records; libvirt's test driver, under this server, has no guest to run
    code): the default one run 3 times, the last ending with `status`, and (`own`)
    one of its own with a run in flight, with the mark that tells the Boxes pages."""
    store = SqlStore(f"sqlite:///{(server.data_dir / 'rift.db').resolve()}")
    try:
        with store.write() as tx:
            vm = tx.vms.get(vm_id)
            assert vm is not None
            tx.code_contexts.put(CodeContext(
                vm_id=vm_id, id="default", task_id=vm.task_id, language="python", cwd=None,
                created_at=now, last_run_at=now, execution_count=3, last_status=status))
            if own:
                tx.code_contexts.put(CodeContext(
                    vm_id=vm_id, id="ctx_abcdefgh", task_id=vm.task_id, language="python",
                    cwd="/srv/<b>data</b>", created_at=now, run_id="run_abcdefgh",
                    run_until=now + timedelta(hours=1)))
            code_records.changed(tx)
    finally:
        store.close()


def test_a_vms_code_contexts_show_with_their_language_and_last_run_live(
        server: Server, page: Any) -> None:
    agent = Agent(server.url, server.token, "claude-code")
    opened = agent.call("rift_task_new", name="notebook work")
    vm = agent.call("rift_vm_new", handle=opened["handle"], image="tiny")["vm"]
    log_in(page, server.url, "admin", server.password)
    mark_page(page)
    row = card(page, opened["task"]["id"]).locator(f"tr[data-vm='{vm['id']}']")
    expect(row.locator("[data-h=Code]")).to_have_text("none")
    record_contexts(server, vm["id"], datetime.now(UTC))
    default = row.locator(".context[data-context='default']")
    expect(default).to_contain_text("default python, ran")
    expect(default).to_contain_text("#3")
    expect(default.locator(".run-status")).to_have_text("error")
    own = row.locator(".context[data-context='ctx_abcdefgh']")
    expect(own).to_have_text("ctx_abcdefgh python, running")
    expect(own).to_have_attribute("title", "in /srv/<b>data</b>")  # text, not markup
    assert same_page(page)
    agent.call("rift_task_close", handle=opened["handle"])


def test_another_users_tasks_never_show(server: Server, page: Any) -> None:
    bob = Agent(server.url, add_user(server, "bob"), "bobs-agent")
    secret = bob.call("rift_task_new", name="bob's own plan")["task"]["id"]
    log_in(page, server.url, "admin", server.password)
    mine = Agent(server.url, server.token, "claude-code").call(
        "rift_task_new", name="made after bob's")["task"]["id"]
    expect(card(page, mine)).to_have_count(1)  # the page is current …
    assert "bob's own plan" not in page.content()  # … and bob's task is not on it
    assert secret not in page.content()


def test_hostile_names_render_as_text_and_do_not_break_the_layout(
        server: Server, page: Any) -> None:
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    log_in(page, server.url, "admin", server.password)
    agent = Agent(server.url, server.token, "<img src=x onerror=alert(3)>")
    hostile = agent.call("rift_task_new", name="<script>alert(1)</script>")["task"]["id"]
    long_id = insert_long_named_task(server, "A" * 4000)
    expect(card(page, hostile).locator(".name")).to_have_text("<script>alert(1)</script>")
    expect(card(page, hostile).locator(".holder")).to_have_text(
        "mcp:<img src=x onerror=alert(3)>")
    long_name = card(page, long_id).locator(".name")
    expect(long_name).to_have_attribute("title", "A" * 4000)
    box = long_name.bounding_box()
    assert box is not None and box["width"] <= 1280 and box["height"] < 120
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    if extra := extra_shots():
        page.screenshot(path=str(extra / "boxes-hostile.png"), full_page=True)
    page.reload()  # the first render too, not only the live one
    expect(card(page, hostile).locator(".name")).to_have_text("<script>alert(1)</script>")
    assert dialogs == []


def insert_long_named_task(server: Server, name: str) -> str:
    """A row no door would take (names are 1 to 200 characters): written straight into
    the server's database, as a bad migration or another version might."""
    store = SqlStore(f"sqlite:///{(server.data_dir / 'rift.db').resolve()}")
    now = datetime.now(UTC)
    task = Task(id=new_task_id(), owner="admin", name=name, status="open", lease_gen=1,
                secret_digest=None, holder=None, held_since=None, last_activity_at=now,
                created_at=now)
    try:
        with store.write() as tx:
            tx.tasks.add(task)
            tx.events.add(NewEvent(task.id, "opened", now, "operator", {}))
    finally:
        store.close()
    return task.id


def test_a_wrong_password_or_an_unknown_user_is_refused_alike(server: Server,
                                                              page: Any) -> None:
    for user, password in (("admin", "not-the-password"), ("nobody", "not-the-password")):
        page.goto(server.url + "/login")
        page.fill("#user", user)
        page.fill("#password", password)
        page.click("button[type=submit]")
        expect(page.locator(".alert")).to_have_text("Wrong user name or password.")
        assert page.url == server.url + "/login"
    assert [c["name"] for c in page.context.cookies()] == ["rift_login_form"]


def test_the_session_cookie_is_httponly_strict_and_expires_and_logout_ends_it(
        server: Server, page: Any) -> None:
    log_in(page, server.url, "admin", server.password)
    cookie = next(c for c in page.context.cookies() if c["name"] == "rift_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert cookie["secure"] is False  # plain HTTP on loopback; HTTPS adds Secure
    assert 11 * 3600 < cookie["expires"] - time.time() <= 12 * 3600
    assert "rift_session" not in page.evaluate("document.cookie")
    assert page.locator("form").count() == 1  # logout is the page's only form
    page.click("form.logout button")
    page.wait_for_url(server.url + "/login")
    assert "rift_session" not in [c["name"] for c in page.context.cookies()]
    page.context.add_cookies([cookie])  # the old cookie, replayed: the session is gone
    page.goto(server.url + "/")
    assert page.url == server.url + "/login"


def test_the_page_follows_the_sweep_closing_an_idle_task(
        browser: Any, tmp_path: Path) -> None:
    proc, quick = start_server(tmp_path, RIFT_TASK_IDLE_S="5", RIFT_SWEEP_INTERVAL_S="1")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        log_in(page, quick.url, "admin", quick.password)
        mark_page(page)
        task_id = Agent(quick.url, quick.token, "claude-code").call(
            "rift_task_new", name="left behind")["task"]["id"]
        expect(card(page, task_id)).to_have_count(1)
        closed = page.locator(f"#live .closed tr[data-task='{task_id}']")
        expect(closed.locator("[data-h=Reason]")).to_contain_text("idle")
        expect(card(page, task_id)).to_have_count(0)
        assert same_page(page)
    finally:
        context.close()
        stop_server(proc)


def test_a_change_through_another_replica_shows_and_the_stream_ends_with_the_page(
        server: Server, browser: Any, tmp_path: Path) -> None:
    log = tmp_path / "replica.log"
    proc, replica = start_replica(server, log)
    context = browser.new_context()
    try:
        page = context.new_page()
        log_in(page, replica, "admin", server.password)  # the page on the replica …
        task_id = Agent(server.url, server.token, "claude-code").call(  # … the change on A
            "rift_task_new", name="made on the other replica")["task"]["id"]
        expect(card(page, task_id)).to_have_count(1)
        page.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not streams_ended(log):
            time.sleep(0.1)
        assert streams_ended(log) == 1  # one stream for the one page, ended with it
    finally:
        context.close()
        stop_server(proc)


def streams_ended(log: Path) -> int:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return sum(1 for e in lines if e.get("msg") == "request" and e.get("path") == "/live")


def test_a_screenshot_of_a_few_tasks_for_the_readme(server: Server, browser: Any) -> None:
    token = add_user(server, "ada", "ada's long password")
    claude = Agent(server.url, token, "claude-code")
    cursor = Agent(server.url, token, "cursor")
    gone = claude.call("rift_task_new", name="bisect the flaky CI job")
    claude.call("rift_vm_new", handle=gone["handle"], name="repro")
    claude.call("rift_task_close", handle=gone["handle"])
    spare = cursor.call("rift_task_new", name="try the 6.12 kernel")
    cursor.call("rift_vm_new", handle=spare["handle"], name="kernel", memory_mib=512)
    cursor.call("rift_task_release", handle=spare["handle"])
    fuzz = cursor.call("rift_task_new", name="nightly fuzzing of the HTTP parser")
    for name, vcpus, memory in (("fuzz-1", 2, 1024), ("fuzz-2", 2, 1024), ("corpus", 1, 256)):
        cursor.call("rift_vm_new", handle=fuzz["handle"], name=name, vcpus=vcpus,
                    memory_mib=memory)
    main = claude.call("rift_task_new", name="refactor the config loader")
    built = [claude.call("rift_vm_new", handle=main["handle"], name=name)["vm"]
             for name in ("build", "test")]
    start = time.time() - 600
    for vm, busy in zip(built, (0.7, 0.15), strict=True):  # a build and its tests' use
        cpu_ns = 0
        samples = []
        for i in range(40):
            cpu_ns += int(10e9 * busy * (1 + 0.3 * math.sin(i / 3)))
            samples.append((start + 10 * i, cpu_ns, 1024 * (260 + 3 * i + 40 * (i % 7 == 0))))
        record_usage(server, vm["id"], samples)
    record_contexts(server, built[0]["id"], datetime.now(UTC) - timedelta(minutes=2), "ok",
                    own=False)
    shots = {"light": (1200, 900, "light"), "dark": (1200, 900, "dark"),
             "phone": (390, 844, "light")}
    for shot, (width, height, scheme) in shots.items():
        context = browser.new_context(viewport={"width": width, "height": height},
                                      color_scheme=scheme, device_scale_factor=1)
        try:
            page = context.new_page()
            log_in(page, server.url, "ada", "ada's long password")
            expect(page.locator("#live article.task")).to_have_count(3)
            assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), shot
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert (background == "rgb(18, 21, 27)") == (scheme == "dark"), background
            if shot == "light":
                SCREENSHOT.parent.mkdir(exist_ok=True)
                page.screenshot(path=str(SCREENSHOT), full_page=True)
            elif extra := extra_shots():
                page.screenshot(path=str(extra / f"boxes-{shot}.png"), full_page=True)
        finally:
            context.close()
    assert SCREENSHOT.stat().st_size > 10_000


def extra_shots() -> Path | None:
    """`RIFT_BOXES_SHOTS=dir` also keeps the dark and phone screenshots, to look at."""
    where = os.environ.get("RIFT_BOXES_SHOTS")
    return Path(where) if where else None


def test_on_postgresql_a_change_through_one_replica_shows_live_on_the_other(
        browser: Any, tmp_path: Path) -> None:
    """Two `rift serve` replicas on one PostgreSQL database: the page on B follows
    a task made through A and its takeover, with no reload."""
    from tests.support.databases import migrated_and_empty, skip_without_postgres
    from tests.support.servers import start_server

    url = skip_without_postgres()
    migrated_and_empty(url)
    (tmp_path / "a").mkdir()
    proc_a, a = start_server(tmp_path / "a", RIFT_DATABASE_URL=url)
    proc_b, b = start_replica(a, tmp_path / "b.log")
    context = browser.new_context()
    try:
        page = context.new_page()
        log_in(page, b, "admin", a.password)
        made = Agent(a.url, a.token, "claude-code").call(
            "rift_task_new", name="made through replica A")
        expect(card(page, made["task"]["id"])).to_have_count(1)
        expect(card(page, made["task"]["id"])).to_contain_text("mcp:claude-code")
        Agent(a.url, a.token, "cursor").call("rift_task_attach", task_id=made["task"]["id"],
                                             takeover=True)
        expect(card(page, made["task"]["id"])).to_contain_text("mcp:cursor")
    finally:
        context.close()
        stop_server(proc_b)
        stop_server(proc_a)
