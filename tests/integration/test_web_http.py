"""The Boxes page over HTTP, in process (Starlette's TestClient) on a SQLite
store and a fake clock: login, sessions, throttling, form tokens, escaping,
404 pages. The browser suite (tests/browser) drives the same page in Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from rift.app import create_app
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.clock import FakeClock
from rift.domain.secrets import digest
from rift.services.access import accounts
from rift.services.context import Caller, Deps
from rift.services.lifecycle import tasks, vms
from web.security import LOGIN_COOKIE, SESSION_COOKIE

PASSWORD = "correct horse battery"
ORIGIN = {"Origin": "http://127.0.0.1"}
ADA = Caller("ada", "mcp:claude-code")


@pytest.fixture
def client(deps: Deps, tmp_path: Path) -> Iterator[TestClient]:
    accounts.add_user(deps, "ada", PASSWORD)
    accounts.add_user(deps, "bob", PASSWORD)
    settings = Settings(data_dir=tmp_path, hypervisor_uri="fake:///local", session_ttl_s=3600)
    with TestClient(create_app(settings, deps), base_url="http://127.0.0.1",
                    follow_redirects=False) as made:
        yield made


def form_token(client: TestClient) -> str:
    page = client.get("/login")
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def log_in(client: TestClient, user: str = "ada", password: str = PASSWORD,
           headers: dict[str, str] | None = None) -> int:
    token = form_token(client)
    answer = client.post("/login", data={"user": user, "password": password, "csrf": token},
                         headers=ORIGIN if headers is None else headers)
    return answer.status_code


def test_the_page_needs_a_login_and_an_api_token_logs_no_one_in(
        client: TestClient, deps: Deps) -> None:
    assert client.get("/").headers["location"] == "/login"
    token = accounts.new_token(deps, "ada").token.value
    answer = client.get("/", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 303 and answer.headers["location"] == "/login"
    assert client.get("/live").status_code == 401


def test_a_login_sets_a_strict_httponly_expiring_cookie_and_shows_the_page(
        client: TestClient) -> None:
    token = form_token(client)
    answer = client.post("/login", data={"user": "ada", "password": PASSWORD, "csrf": token},
                         headers=ORIGIN)
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    cookie = next(c for c in answer.headers.get_list("set-cookie")
                  if c.startswith(SESSION_COOKIE + "="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=3600" in cookie
    assert "Secure" not in cookie  # plain HTTP here; HTTPS adds it
    page = client.get("/")
    assert page.status_code == 200
    assert "rift_task_close" in page.text and "rift_vm_destroy" in page.text
    assert "A task quiet for 4 hours closes itself" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_the_session_cookie_is_secure_over_https(client: TestClient) -> None:
    client.base_url = client.base_url.copy_with(scheme="https")
    token = form_token(client)
    answer = client.post("/login", data={"user": "ada", "password": PASSWORD, "csrf": token},
                         headers={"Origin": "https://127.0.0.1"})
    assert answer.status_code == 303
    cookie = next(c for c in answer.headers.get_list("set-cookie")
                  if c.startswith(SESSION_COOKIE + "="))
    assert "Secure" in cookie


def test_the_store_keeps_only_a_digest_of_the_session_id(client: TestClient,
                                                         deps: Deps) -> None:
    assert log_in(client) == 303
    session_id = client.cookies[SESSION_COOKIE]
    with deps.store.read() as tx:
        assert tx.web.get_session(session_id) is None
        assert tx.web.get_session(digest(session_id)) is not None


def test_a_wrong_password_and_an_unknown_user_get_the_same_answer(client: TestClient) -> None:
    wrong = client.post("/login", data={"user": "ada", "password": "nope-nope",
                                        "csrf": form_token(client)}, headers=ORIGIN)
    unknown = client.post("/login", data={"user": "zed", "password": "nope-nope",
                                          "csrf": form_token(client)}, headers=ORIGIN)
    assert wrong.status_code == unknown.status_code == 401
    assert "Wrong user name or password." in wrong.text
    assert wrong.text.replace("ada", "zed").split("csrf")[0] == unknown.text.split("csrf")[0]
    assert SESSION_COOKIE not in client.cookies


def test_repeated_failures_are_slowed_down_then_let_through_after_the_wait(
        client: TestClient, clock: FakeClock) -> None:
    for _ in range(3):
        assert log_in(client, password="wrong-password") == 401
    throttled = client.post("/login", data={"user": "ada", "password": PASSWORD,
                                            "csrf": form_token(client)}, headers=ORIGIN)
    assert throttled.status_code == 429 and throttled.headers["retry-after"] == "1"
    assert "Too many failed sign-ins" in throttled.text
    clock.advance(1)
    assert log_in(client, password="wrong-password") == 401
    assert log_in(client) == 429  # now 2 s
    clock.advance(2)
    assert log_in(client) == 303  # the right password after the wait; the count is cleared
    client.cookies.clear()
    assert log_in(client, user="ada", password="wrong-password") == 401


def test_the_login_form_refuses_a_missing_token_or_another_origin(client: TestClient) -> None:
    client.get("/login")
    no_token = client.post("/login", data={"user": "ada", "password": PASSWORD},
                           headers=ORIGIN)
    assert no_token.status_code == 403
    token = form_token(client)
    elsewhere = client.post("/login", data={"user": "ada", "password": PASSWORD,
                                            "csrf": token},
                            headers={"Origin": "https://evil.example"})
    assert elsewhere.status_code == 403
    client.cookies.delete(LOGIN_COOKIE, path="/login")
    no_cookie = client.post("/login", data={"user": "ada", "password": PASSWORD,
                                            "csrf": token}, headers=ORIGIN)
    assert no_cookie.status_code == 403
    assert SESSION_COOKIE not in client.cookies


def test_logout_needs_its_token_and_ends_the_session_everywhere(client: TestClient) -> None:
    assert log_in(client) == 303
    session_id = client.cookies[SESSION_COOKIE]
    page = client.get("/").text
    found = re.search(r'action="/logout">\s*<input type="hidden" name="csrf" value="([^"]+)"',
                      page)
    assert found is not None
    assert client.post("/logout", data={"csrf": "forged"}, headers=ORIGIN).status_code == 403
    assert client.get("/").status_code == 200
    out = client.post("/logout", data={"csrf": found.group(1)}, headers=ORIGIN)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    client.cookies.set(SESSION_COOKIE, session_id)  # a copy of the old cookie buys nothing
    assert client.get("/").headers["location"] == "/login"


def test_a_session_expires(client: TestClient, clock: FakeClock) -> None:
    assert log_in(client) == 303
    clock.advance(3599)
    assert client.get("/").status_code == 200
    clock.advance(1)
    assert client.get("/").headers["location"] == "/login"


def test_the_page_shows_only_the_users_tasks_with_hostile_names_as_text(
        client: TestClient, deps: Deps) -> None:
    hostile = tasks.new(deps, ADA, c.TaskNewIn(name="<script>alert(1)</script>"))
    vms.new(deps, ADA, c.VmNewIn(handle=hostile.handle,
                                 name='"><img src=x onerror=alert(2)>'))
    tasks.new(deps, Caller("bob", "mcp:bob-agent"), c.TaskNewIn(name="bob's plan"))
    assert log_in(client) == 303
    page = client.get("/").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "bob&#39;s plan" not in page and "bob's plan" not in page
    assert hostile.handle not in page and hostile.handle.split(".")[1] not in page


def test_the_page_lists_newest_activity_first_and_recently_closed_with_reason(
        client: TestClient, deps: Deps, clock: FakeClock) -> None:
    first = tasks.new(deps, ADA, c.TaskNewIn(name="first"))
    clock.advance(120)
    tasks.new(deps, ADA, c.TaskNewIn(name="second"))
    clock.advance(120)
    tasks.get(deps, ADA, c.TaskGetIn(handle=first.handle))  # a touch: first is newest again
    gone = tasks.new(deps, ADA, c.TaskNewIn(name="gone"))
    tasks.close(deps, ADA, command(c.TaskCloseIn, handle=gone.handle))
    assert log_in(client) == 303
    page = client.get("/").text
    live, closed = page.split('id="closed-h"')
    assert live.index(">first<") < live.index(">second<")
    assert ">gone<" not in live and ">gone<" in closed and "r-closed" in closed


def test_with_no_tasks_the_page_says_how_to_connect_an_agent(client: TestClient) -> None:
    assert log_in(client) == 303
    page = client.get("/").text
    assert "rift token new ada --label laptop" in page
    assert "claude mcp add --transport http rift http://127.0.0.1/mcp" in page


def test_unknown_routes_answer_an_html_404_and_the_api_keeps_its_json(
        client: TestClient, deps: Deps) -> None:
    page = client.get("/no/such/page", headers={"Accept": "text/html"})
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "Not found" in page.text
    token = accounts.new_token(deps, "ada").token.value
    api = client.get("/api/v1/nothing-here", headers={"Accept": "text/html",
                                                       "Authorization": f"Bearer {token}"})
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
    assert client.get("/static/nope.css").status_code == 404


def test_the_page_is_left_out_of_the_openapi_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/", "/login", "/logout", "/live"} & set(paths)
