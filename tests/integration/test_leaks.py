"""What Rift's own answers must not give away (SPEC §15 "Leaks"), over HTTP in
process (Starlette's TestClient, a SQLite store, the fake hypervisor): /metrics
names VMs and tasks to operators' tokens only; the Boxes page's script policy
names its own files; /docs loads nothing from another site; the session cookie
is Secure when RIFT_PUBLIC_URL is https. Exposures' headers are tested with the
proxy in tests/integration/test_exposures.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from starlette.testclient import TestClient

from rift.app import create_app
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain import usage
from rift.services.access import accounts
from rift.services.context import Deps
from rift.services.lifecycle import tasks, vms
from tests.support.engine import ALICE
from web.security import LOGIN_COOKIE, SESSION_COOKIE

PASSWORD = "correct horse battery"
BASE = "http://127.0.0.1"


def _client(deps: Deps, tmp_path: Path, public_url: str | None = None) -> TestClient:
    settings = Settings(data_dir=tmp_path, hypervisor_uri="fake:///local",
                        public_url=public_url)
    return TestClient(create_app(settings, deps), base_url=BASE, follow_redirects=False)


@pytest.fixture
def client(deps: Deps, tmp_path: Path) -> Iterator[TestClient]:
    accounts.add_user(deps, ALICE.user, PASSWORD)
    with _client(deps, tmp_path) as made:
        yield made


def _log_in(client: TestClient) -> list[str]:
    """Sign in as alice; the Set-Cookie headers of the form and of the sign-in."""
    form = client.get("/login")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None
    # Sent by hand: a client on plain HTTP (as behind a TLS proxy) keeps Secure cookies.
    answer = client.post("/login", data={"user": ALICE.user, "password": PASSWORD,
                                         "csrf": found.group(1)},
                         headers={"Origin": BASE,
                                  "Cookie": f"{LOGIN_COOKIE}={form.cookies[LOGIN_COOKIE]}"})
    assert answer.status_code == 303, answer.text
    return [*form.headers.get_list("set-cookie"), *answer.headers.get_list("set-cookie")]


def _running_vm_with_stats(deps: Deps) -> tuple[str, str]:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    stats = usage.advance(None, usage.Sample(at=1.7e9, cpu_time_ns=10**9,
                                             memory_rss_kib=65536,
                                             disk_allocation_bytes=2**20), 1)
    with deps.store.write() as tx:
        assert tx.vms.record_stats(vm.id, stats)
    return vm.id, opened.task.id


# -- /metrics ---------------------------------------------------------------------------

def test_metrics_name_vms_and_tasks_to_an_operators_token_only(
        client: TestClient, deps: Deps) -> None:
    vm_id, task_id = _running_vm_with_stats(deps)
    plain = accounts.new_token(deps, ALICE.user, "agent").token.value
    operator = accounts.new_token(deps, ALICE.user, "prometheus", operator=True).token.value

    answer = client.get("/metrics", headers={"Authorization": f"Bearer {plain}"})
    assert answer.status_code == 200
    assert "rift_running_vms 1.0" in answer.text  # aggregates: for any token
    assert vm_id not in answer.text and task_id not in answer.text
    assert not re.search(r'\b(vm|task|user)="', answer.text), answer.text
    assert "rift_vm_memory_used_mib" not in answer.text

    seen = client.get("/metrics", headers={"Authorization": f"Bearer {operator}"})
    assert seen.status_code == 200
    labels = f'host="local",task="{task_id}",vm="{vm_id}"'
    assert f"rift_vm_memory_used_mib{{{labels}}} 64.0" in seen.text
    assert "rift_running_vms 1.0" in seen.text
    assert client.get("/metrics").status_code == 401


# -- the Boxes page's script policy -----------------------------------------------------

def _policy(header: str) -> dict[str, list[str]]:
    return {name: values for name, *values in
            (part.split() for part in header.split(";") if part.strip())}


def test_the_boxes_pages_policy_names_its_own_files_and_nothing_else(
        client: TestClient) -> None:
    login = client.get("/login")  # the sign-in and error pages carry the same policy
    _log_in(client)
    page = client.get("/")
    assert page.status_code == 200
    policy = _policy(page.headers["content-security-policy"])
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == [f"{BASE}/static/boxes.js"]  # not 'self': /x/ is this origin
    assert policy["style-src"] == [f"{BASE}/static/boxes.css"]
    assert policy["connect-src"] == [f"{BASE}/live"]
    assert policy["base-uri"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert not any("unsafe" in value for values in policy.values() for value in values)
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page.text, re.S)
    assert scripts, "the page has its script"
    for attributes, body in scripts:  # no inline script: each names a file the policy names
        assert body.strip() == ""
        src = re.search(r'src="([^"]+)"', attributes)
        assert src is not None and BASE + src.group(1) in policy["script-src"]
    assert not re.search(r"\son[a-z]+=", page.text)  # no inline handlers either
    assert not re.search(r"<style\b|\sstyle=", page.text)
    for path in ("/static/boxes.js", "/static/boxes.css"):
        assert client.get(path).status_code == 200
    assert _policy(login.headers["content-security-policy"])["script-src"] == \
        policy["script-src"]
    missing = client.get("/nowhere", headers={"Accept": "text/html"})
    assert missing.status_code == 404 and "default-src 'none'" in \
        missing.headers["content-security-policy"]


def test_behind_a_proxy_the_policy_names_the_public_urls_files_too(
        deps: Deps, tmp_path: Path) -> None:
    """A proxy that does not pass the original `Host` on: the browser's origin is
    RIFT_PUBLIC_URL's, so the page's files are named there as well."""
    with _client(deps, tmp_path, "https://Rift.Example.com/") as client:
        policy = _policy(client.get("/login").headers["content-security-policy"])
    assert policy["script-src"] == [f"{BASE}/static/boxes.js",
                                    "https://rift.example.com/static/boxes.js"]
    assert policy["connect-src"] == [f"{BASE}/live", "https://rift.example.com/live"]


# -- /docs ------------------------------------------------------------------------------

def test_docs_load_nothing_from_another_site(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:https?:)?//[^\s"'<>)]+""", page.text)
    others = {urlsplit(url if ":" in url.split("//")[0] else "http:" + url).netloc
              for url in urls} - {"127.0.0.1"}
    assert others == set(), others
    assert "<script" not in page.text and "<iframe" not in page.text
    policy = _policy(page.headers["content-security-policy"])
    assert policy["default-src"] == ["'none'"] and "http" not in " ".join(
        v for name, values in policy.items() for v in values if not v.startswith(BASE))
    # What it documents: every REST route, each body and answer schema.
    for route in ("POST /api/v1/tasks", "GET /api/v1/vms/{vm_id}", "POST /api/v1/vms/{vm_id}/exec"):
        assert f"<code>{route}</code>" in page.text, route
    assert 'id="schema-TaskView"' in page.text and 'href="/openapi.json"' in page.text
    assert client.get("/openapi.json").status_code == 200
    for gone in ("/redoc", "/docs/oauth2-redirect"):  # FastAPI's CDN pages are off
        assert client.get(gone).status_code == 404


# -- the session cookie -----------------------------------------------------------------

@pytest.mark.parametrize(("public_url", "secure"), [
    (None, False), ("http://rift.example.com", False), ("https://rift.example.com", True),
    ("HTTPS://rift.example.com:8443/", True)])
def test_the_session_cookie_is_secure_when_the_public_url_is_https(
        deps: Deps, tmp_path: Path, public_url: str | None, secure: bool) -> None:
    """Behind a TLS proxy the request may arrive as plain HTTP: an https
    RIFT_PUBLIC_URL still makes the cookies Secure; without one, plain HTTP does not."""
    accounts.add_user(deps, ALICE.user, PASSWORD)
    with _client(deps, tmp_path, public_url) as client:
        cookies = _log_in(client)
        for name in (LOGIN_COOKIE, SESSION_COOKIE):
            cookie = next(c for c in cookies if c.startswith(name + "="))
            assert ("; secure" in cookie.lower()) is secure, cookie
            assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        logged_out = client.post("/logout", data={"csrf": "x"}, headers={"Origin": BASE})
        for cookie in logged_out.headers.get_list("set-cookie"):
            assert ("; secure" in cookie.lower()) is secure, cookie
