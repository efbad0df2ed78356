"""Hypothesis over every tool's input, through the SDK client into a real server:
no internal error, no protocol error, every failure a refusal with code and hint,
every success valid against the tool's outputSchema (the SDK client checks it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client.session import ClientSession

from rift.api.mcp_schema import Field
from rift.api.mcp_tools import TOOLS
from tests.e2e.conftest import Server
from tests.e2e.test_mcp import REFUSAL_CODES, call, mcp_session

EXAMPLES_PER_TOOL = 40

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=5)


class Live:
    """One fuzz user's session, with real ids and a real handle to aim at."""

    def __init__(self, portal: BlockingPortal, session: ClientSession,
                 handle: str, task_id: str, vm_id: str) -> None:
        self.portal, self.session = portal, session
        self.handle, self.task_id, self.vm_id = handle, task_id, vm_id


@pytest.fixture(scope="module")
def live(server: Server) -> Iterator[Live]:
    token = server.new_token("fuzz", "hypothesis")
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(
            mcp_session(server.url, token, "fuzzer")) as session:
        opened = portal.call(lambda: call(session, "rift_task_new", name="fuzz"))
        vm = portal.call(lambda: call(session, "rift_vm_new", handle=opened["handle"]))
        yield Live(portal, session, opened["handle"], opened["task"]["id"], vm["vm"]["id"])


def near(field: Field, live: Live, name: str) -> st.SearchStrategy[Any]:
    """Values at and around the field's edges, and real ones."""
    real = {"handle": [live.handle, live.handle + "x", "task_aaaaaaaa." + "A" * 43],
            "task_id": [live.task_id], "after": [live.task_id], "vm_id": [live.vm_id]}
    options: list[st.SearchStrategy[Any]] = [st.sampled_from(real.get(name, [None]))]
    if field.kind == "integer":
        low = -(2**70) if field.low is None else field.low
        high = 2**70 if field.high is None else field.high
        options += [st.integers(low - 2, low + 2), st.integers(high - 2, high + 2),
                    st.integers(low, high), st.floats(allow_nan=True)]
    elif field.kind == "string":
        high = field.high or 50
        options += [st.text(max_size=high + 2 if high <= 250 else 30),
                    st.sampled_from(list(field.enum or ("",)))]
        if high <= 100_000:
            options.append(st.just("x" * (high + 1)))
    else:
        options.append(st.booleans())
    return st.one_of(*options)


def arguments(tool_name: str, live: Live) -> st.SearchStrategy[dict[str, Any]]:
    fields = TOOLS[tool_name].fields
    known = st.fixed_dictionaries({}, optional={
        name: st.one_of(near(field, live, name), JSON) for name, field in fields.items()})
    stray = st.dictionaries(st.text(min_size=1, max_size=12), JSON, max_size=2)
    return st.one_of(known, st.builds(lambda a, b: {**b, **a}, known, stray))


@pytest.mark.parametrize("tool_name", sorted(TOOLS))
def test_any_input_is_answered_or_refused_never_an_internal_error(
        live: Live, tool_name: str) -> None:
    @settings(max_examples=EXAMPLES_PER_TOOL, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def probe(data: st.DataObject) -> None:
        args = data.draw(arguments(tool_name, live))

        async def one_call() -> None:
            with anyio.fail_after(30):
                result = await live.session.call_tool(tool_name, args)
            if result.is_error:
                error = (result.structured_content or {}).get("error", {})
                assert error.get("code") in REFUSAL_CODES, (args, error)
                assert error.get("message") and error.get("hint"), (args, error)
            else:
                assert isinstance(result.structured_content, dict), args

        live.portal.call(one_call)

    probe()
