"""One contract per tool: the MCP door's `inputSchema`/`outputSchema` and the REST
door's OpenAPI come from the same pydantic models (rift/contract/tools.py), so a
field added to a view or an input shows at both doors at once."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from rift.api.app import create_app
from rift.api.mcp import build_server
from rift.api.state import AppState
from rift.config import Settings
from rift.contract.base import inline
from rift.contract.tools import CONTRACTS, Refusal

# Each tool's REST operation, and where its input's fields travel there.
ROUTES: dict[str, tuple[str, str]] = {
    "rift_task_new": ("post", "/api/v1/tasks"),
    "rift_task_attach": ("post", "/api/v1/tasks/{task_id}/attach"),
    "rift_task_release": ("post", "/api/v1/tasks/{task_id}/release"),
    "rift_task_close": ("post", "/api/v1/tasks/{task_id}/close"),
    "rift_task_list": ("get", "/api/v1/tasks"),
    "rift_task_get": ("get", "/api/v1/tasks/{task_id}"),
    "rift_task_events": ("get", "/api/v1/tasks/{task_id}/events"),
    "rift_vm_new": ("post", "/api/v1/tasks/{task_id}/vms"),
    "rift_vm_get": ("get", "/api/v1/vms/{vm_id}"),
    "rift_vm_destroy": ("delete", "/api/v1/vms/{vm_id}"),
    "rift_vm_exec": ("post", "/api/v1/vms/{vm_id}/exec"),
    "rift_vm_write_file": ("put", "/api/v1/vms/{vm_id}/files"),
    "rift_vm_read_file": ("get", "/api/v1/vms/{vm_id}/files"),
}


def _normal(node: Any) -> Any:
    """A schema as both doors mean it: without generated titles, and an optional
    field without the `null` branch FastAPI adds to query parameters and bodies."""
    if isinstance(node, list):
        return [_normal(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _normal(v) for k, v in node.items() if k != "title"}
    branches = out.get("anyOf")
    if isinstance(branches, list):
        kept = [b for b in branches if b != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(branches):
            del out["anyOf"]
            out = {**kept[0], **out}
    if out.get("default", 0) is None:
        del out["default"]
    return out


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    api = create_app(Settings(hypervisor_uri="test:///default")).openapi()
    return inline(api, api["components"]["schemas"], "#/components/schemas/")


@pytest.fixture(scope="module")
def listed() -> dict[str, types.Tool]:
    server = build_server(AppState(Settings()))

    async def tools() -> list[types.Tool]:
        async with Client(server, mode="2026-07-28") as client:
            return (await client.list_tools()).tools

    return {t.name: t for t in anyio.run(tools)}


@pytest.mark.parametrize("tool", sorted(CONTRACTS))
def test_the_mcp_and_openapi_schemas_of_a_tool_come_from_its_models(
        tool: str, openapi: dict[str, Any], listed: dict[str, types.Tool]) -> None:
    contract = CONTRACTS[tool]
    method, path = ROUTES[tool]
    operation = openapi["paths"][path][method]
    published = listed[tool]

    # MCP publishes the input model's schema, whole and without references …
    assert published.input_schema == inline(contract.input.model_json_schema())
    fields = published.input_schema["properties"]
    # … and REST takes each field it carries from the same model: the body's …
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    carried = set()
    if body is not None:
        schema = _normal(body["schema"])
        assert schema["additionalProperties"] is False
        for name, prop in schema["properties"].items():
            assert _normal(prop) == fields[name], (tool, name)
            carried.add(name)
    # … and the query's (the path carries ids, the Rift-Handle header the handle).
    # Path and header parameters are typed by the same contract (a route's path may
    # also name the task a handle belongs to: it must agree with the handle).
    for param in operation.get("parameters", []):
        name = "handle" if param["name"] == "Rift-Handle" else param["name"]
        assert param["in"] in ("query", "path", "header"), param
        if param["in"] == "header":
            assert param["name"] == "Rift-Handle"
        if name in fields or param["in"] != "path":
            assert _normal(param["schema"]) == fields[name], (tool, name)
            carried.add(name)
    assert carried == set(fields), (tool, set(fields) ^ carried)

    # Both doors answer the output model: REST as its response, MCP as its
    # outputSchema, beside the refusal that MCP's admits too.
    answer = next(r for code, r in operation["responses"].items() if code.startswith("2"))
    output = inline(contract.output.model_json_schema())
    assert _normal(answer["content"]["application/json"]["schema"]) == _normal(output)
    assert published.output_schema == {
        "type": "object", "anyOf": [output, inline(Refusal.model_json_schema())]}
    refusal = _normal(operation["responses"]["409"]["content"]["application/json"]["schema"])
    assert refusal == _normal(inline(Refusal.model_json_schema()))


def test_a_field_added_to_a_view_shows_at_both_doors(openapi: dict[str, Any],
                                                     listed: dict[str, types.Tool]) -> None:
    """The VM view is declared once: the fields both doors show are its fields."""
    from rift.contract.views import VmView

    rest = openapi["paths"]["/api/v1/vms/{vm_id}"]["get"]["responses"]["200"]
    rest_vm = rest["content"]["application/json"]["schema"]["properties"]["vm"]
    mcp_vm = listed["rift_vm_get"].output_schema["anyOf"][0]["properties"]["vm"]  # type: ignore[index]
    assert set(rest_vm["properties"]) == set(mcp_vm["properties"]) == set(VmView.model_fields)
