"""The Boxes page and /docs in Chromium under their Content-Security-Policy
(SPEC §15 "Leaks"): the page's own script, style sheet and live stream load and
run with no violation; a script from anywhere else on the same origin (an
exposure under `/x/`) or inline is blocked; /docs asks nothing of another site."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import expect

from tests.support.browser import log_in
from tests.support.servers import Server

WATCH = """() => { window.__violations = [];
  document.addEventListener('securitypolicyviolation', e => window.__violations.push(
    {directive: e.effectiveDirective, blocked: e.blockedURI})); }"""


def violations(page: Any) -> list[dict[str, str]]:
    found: list[dict[str, str]] = page.evaluate("window.__violations || []")
    return found


def test_the_boxes_page_runs_its_own_files_and_nothing_else(server: Server, page: Any) -> None:
    requested: list[str] = []
    answered: list[str] = []  # Chromium tells of a blocked request too, but it gets no answer
    page.on("request", lambda request: requested.append(request.url))
    page.on("response", lambda response: answered.append(response.url))
    page.add_init_script(f"({WATCH})()")
    log_in(page, server.url, "admin", server.password)  # waits until the live stream is up
    assert violations(page) == []
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(246, 247, 249)"  # boxes.css applied (--bg, light scheme)
    page.evaluate("""() => {
      const outside = document.createElement('script');
      outside.src = '/x/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/evil.js';
      document.head.appendChild(outside);
      const inline = document.createElement('script');
      inline.textContent = 'window.__inlineRan = true';
      document.head.appendChild(inline);
    }""")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    page.wait_for_function("window.__violations.length >= 2")
    blocked = violations(page)
    assert {v["directive"] for v in blocked} == {"script-src-elem"}, blocked
    assert any("/x/" in v["blocked"] for v in blocked)
    assert any(v["blocked"] == "inline" for v in blocked)
    assert page.evaluate("window.__inlineRan === undefined")
    assert not any("/x/" in url for url in answered)  # blocked before it was sent
    origin = urlsplit(server.url).netloc
    assert {urlsplit(url).netloc for url in requested} == {origin}


def test_docs_ask_nothing_of_another_site(server: Server, page: Any) -> None:
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.add_init_script(f"({WATCH})()")
    page.goto(server.url + "/docs")
    expect(page.locator("h1")).to_contain_text("Rift")
    expect(page.locator("section#schema-TaskView")).to_have_count(1)
    assert violations(page) == []
    assert {urlsplit(url).netloc for url in requested} == {urlsplit(server.url).netloc}
    assert page.evaluate("document.scripts.length") == 0
