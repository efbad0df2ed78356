"""In-process checks of the MCP door's own parts: the argument check agrees with
the published JSON schemas, and an unexpected exception never reaches the client."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mcp_types as types
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp import Client
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from rift.api.mcp.callers import name_in_session_id, name_in_user_agent, session_id_for
from rift.api.mcp.server import build_server
from rift.api.mcp.tools import TOOLS
from rift.api.state import AppState
from rift.config import Settings
from rift.contract.base import parse
from rift.domain.errors import InvalidArgument
from rift.services.context import Deps
from tests.support.mcp_clients import run

NAMED = {tool.name: tool for tool in TOOLS}

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.integers(60, 70), st.integers(),
    st.floats(), st.sampled_from([1.0, 64.0, 3600.0, 2.5]),
    st.text(max_size=8), st.sampled_from(["task_abcdefgh", "vm_abcdefgh", "open", "base64",
                                          "x" * 200, "x" * 201, ""]),
    st.lists(st.integers(), max_size=2))


@pytest.mark.parametrize("tool_name", sorted(tool.name for tool in TOOLS))
def test_the_argument_check_agrees_with_the_published_schema(tool_name: str) -> None:
    contract = NAMED[tool_name].contract
    validator = Draft202012Validator(contract.input_schema)
    fields = list(contract.input_schema["properties"])
    keys = st.sampled_from([*fields, "extra"])

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(args=st.dictionaries(keys, VALUES, max_size=4))
    def agree(args: dict[str, Any]) -> None:
        # JSON Schema's `$` ends the value (ECMA 262); Python's re also lets it match
        # before a final newline, which the jsonschema library inherits.
        assume(not any(isinstance(v, str) and v.endswith("\n") for v in args.values()))
        try:
            parse(contract.input, args, contract.name)
            accepted = True
        except InvalidArgument as exc:
            accepted = False
            assert exc.details["field"] in (*fields, "extra")
        assert accepted == validator.is_valid(args), (args, list(validator.iter_errors(args)))

    agree()


def test_a_declared_name_rides_the_session_id_and_survives_a_round_trip() -> None:
    for name in ("claude-code", "Cursor 1.2", "ünïcode ✓"):
        session = session_id_for(name)
        assert all(0x21 <= ord(c) <= 0x7E for c in session)  # visible ASCII, as the spec asks
        assert name_in_session_id(session) == name
    assert name_in_session_id("0f3a9c2e-opaque") is None
    assert name_in_session_id("r1.00.%%%") is None
    assert name_in_session_id(session_id_for("a\x1b[31mred\nline")) == "a [31mred line"
    assert name_in_user_agent("claude-code/1.0.61 (external, cli)") == "claude-code"
    assert name_in_user_agent("python-httpx/0.28.1") is None
    assert name_in_user_agent("") is None


class BrokenStore:
    """A store failing in a way no refusal covers, with a secret-looking message."""

    def read(self) -> Any:
        raise RuntimeError("boom at /var/lib/rift near task_abcdefgh." + "S" * 43)

    write = read


@contextmanager
def signed_in(user: str) -> Iterator[None]:
    token = auth_context_var.set(AuthenticatedUser(
        AccessToken(token="tok_aaaaaaaa", client_id="tok_aaaaaaaa", scopes=[], subject=user)))
    try:
        yield
    finally:
        auth_context_var.reset(token)


def test_an_unexpected_exception_is_an_internal_refusal_without_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    state = AppState(Settings())
    state.start(Deps(store=BrokenStore(), clock=None, hosts=None, images=None))  # type: ignore[arg-type]
    server = build_server(state)

    async def scenario() -> None:
        with signed_in("admin"):
            async with Client(server, mode="2026-07-28", client_info=types.Implementation(
                    name="in-process", version="1")) as client:
                return_value = await client.call_tool("rift_task_get", {"task_id": "task_abcdefgh"})
        assert return_value.is_error
        error = (return_value.structured_content or {})["error"]
        assert error["code"] == "internal" and error["hint"]
        text = return_value.content[0]
        assert isinstance(text, types.TextContent)
        assert "boom" not in text.text and "Traceback" not in text.text
        assert "S" * 43 not in str(return_value.structured_content)

    with caplog.at_level(logging.ERROR, logger="rift.api.mcp"):
        run(scenario)
    assert any(r.getMessage() == "tool call failed" and r.exc_info for r in caplog.records)
    assert state.metrics.registry.get_sample_value(
        "rift_tool_calls_total",
        {"door": "mcp", "tool": "rift_task_get", "outcome": "internal"}) == 1.0
