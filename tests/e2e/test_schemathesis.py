"""Schemathesis over /openapi.json: no route answers an internal error, and every
refusal has a code and a hint. Driven through schemathesis' own strategies (one
Hypothesis run per operation), without its pytest plugin."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.e2e.conftest import Server

INTENDED_5XX = {"no_capacity", "guest_unreachable", "hypervisor_error"}
EXAMPLES_PER_OPERATION = 40


def _check(case: Any, server: Server, seen: dict[int, int]) -> None:
    response = case.call(headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
    seen[response.status_code] = seen.get(response.status_code, 0) + 1
    where = f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
    assert response.status_code != 500, where
    if response.status_code >= 400:
        body = response.json()
        assert body["error"]["code"] and body["error"]["hint"], where
        if response.status_code >= 500:
            assert body["error"]["code"] in INTENDED_5XX, where


def test_no_route_answers_an_internal_error(server: Server) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 13
    seen: dict[int, int] = {}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            _check(case, server, seen)

        run()
    assert sum(seen.values()) >= 13 * 10, seen
    assert any(200 <= status < 300 for status in seen) and 422 in seen, seen
