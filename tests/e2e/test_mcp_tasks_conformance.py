"""The MCP conformance suite's Tasks scenarios (@modelcontextprotocol/conformance
0.2.0-alpha.12, the 2026-07-28 extension) against `rift serve`. Most of their
checks call the suite's own fixture tools (`greet`, `slow_compute`,
`failing_job`, …), which a server of Rift's tools does not have; every check
that needs none passes, and every other fails only for want of its fixture."""

from __future__ import annotations

from urllib.parse import urlsplit

from tests.support.js_clients import bearer_proxy, conformance
from tests.support.servers import Server

SCENARIOS = ("tasks-capability-negotiation", "tasks-dispatch-and-envelope",
             "tasks-request-headers")
FIXTURE_FREE = {
    "tasks-extension-advertised", "sep-2663-tasks-methods-non-declaring",
    "sep-2663-tasks-result-removed-method-not-found", "tasks-removed-tasks-list",
    "sep-2663-tasks-get-invalid-task-id-32602", "tasks-headers-reject-mismatched-method",
    "wire-schema-valid"}
WANTS_A_FIXTURE = ("Unknown tool: ", "Not testable", "fixture from Check")


def test_the_tasks_scenarios_pass_every_check_that_needs_no_fixture_tool(
        server: Server) -> None:
    with bearer_proxy(urlsplit(server.url).port or 80, server.token) as port:
        checks = [(scenario, check) for scenario in SCENARIOS
                  for check in conformance(f"http://localhost:{port}/mcp", scenario)]
    passed = {c["id"] for _, c in checks if c["status"] == "SUCCESS"}
    assert passed == FIXTURE_FREE, checks
    for scenario, check in checks:
        if check["status"] != "SUCCESS":
            reason = check.get("errorMessage") or ""
            assert any(why in reason for why in WANTS_A_FIXTURE), (scenario, check)
