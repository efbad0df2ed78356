"""One contract per tool: the MCP door's `inputSchema`/`outputSchema` and the REST
door's OpenAPI come from the same pydantic models (rift/contract/, by resource), so a
field added to a view or an input shows at both doors at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from rift.api.mcp.server import build_server
from rift.api.state import AppState
from rift.app import create_app
from rift.config import Settings
from rift.contract.base import inline
from rift.contract.tool import Refusal, ToolContract
from rift.contract.tools import CONTRACTS
from rift.services.context import Deps
from tests.support.raw_mcp import call_tool

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
    "rift_vm_pause": ("post", "/api/v1/vms/{vm_id}/pause"),
    "rift_vm_resume": ("post", "/api/v1/vms/{vm_id}/resume"),
    "rift_vm_snapshot": ("post", "/api/v1/vms/{vm_id}/snapshots"),
    "rift_vm_snapshot_delete": ("delete", "/api/v1/snapshots/{snapshot_id}"),
    "rift_vm_fork": ("post", "/api/v1/snapshots/{snapshot_id}/fork"),
    "rift_vm_expose": ("post", "/api/v1/vms/{vm_id}/exposures"),
    "rift_vm_unexpose": ("delete", "/api/v1/vms/{vm_id}/exposures/{port}"),
    "rift_vm_exec": ("post", "/api/v1/vms/{vm_id}/exec"),
    "rift_vm_exec_get": ("get", "/api/v1/execs/{exec_id}"),
    "rift_vm_exec_input": ("post", "/api/v1/execs/{exec_id}/input"),
    "rift_vm_exec_kill": ("post", "/api/v1/execs/{exec_id}/kill"),
    "rift_vm_exec_list": ("get", "/api/v1/vms/{vm_id}/execs"),
    "rift_vm_write_file": ("put", "/api/v1/vms/{vm_id}/files"),
    "rift_vm_read_file": ("get", "/api/v1/vms/{vm_id}/files"),
    "rift_vm_attach_volume": ("post", "/api/v1/vms/{vm_id}/volumes"),
    "rift_vm_detach_volume": ("delete", "/api/v1/vms/{vm_id}/volumes/{volume_id}"),
    "rift_volume_new": ("post", "/api/v1/volumes"),
    "rift_volume_list": ("get", "/api/v1/volumes"),
    "rift_volume_get": ("get", "/api/v1/volumes/{volume_id}"),
    "rift_volume_delete": ("delete", "/api/v1/volumes/{volume_id}"),
    "rift_volume_resize": ("post", "/api/v1/volumes/{volume_id}/resize"),
    "rift_volume_clone": ("post", "/api/v1/volumes/{volume_id}/clone"),
    "rift_vm_run_code": ("post", "/api/v1/vms/{vm_id}/code"),
    "rift_vm_run_code_get": ("get", "/api/v1/vms/{vm_id}/code/runs/{run_id}"),
    "rift_vm_code_context_new": ("post", "/api/v1/vms/{vm_id}/code/contexts"),
    "rift_vm_code_context_list": ("get", "/api/v1/vms/{vm_id}/code/contexts"),
    "rift_vm_code_context_restart": ("post",
                                     "/api/v1/vms/{vm_id}/code/contexts/{context_id}/restart"),
    "rift_vm_code_context_delete": ("delete", "/api/v1/vms/{vm_id}/code/contexts/{context_id}"),
}
# Tools with a second route: between them, the routes carry every field.
ALSO_ROUTES: dict[str, list[tuple[str, str]]] = {
    "rift_vm_fork": [("post", "/api/v1/vms/{vm_id}/fork")],
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


def _carried(tool: str, operation: dict[str, Any], fields: dict[str, Any]) -> set[str]:
    """The tool's fields a REST operation carries, each typed by the same model."""
    # REST takes each field it carries from the same model: the body's …
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    carried: set[str] = set()
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
    return carried


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda contract: contract.name)
def test_the_mcp_and_openapi_schemas_of_a_tool_come_from_its_models(
        contract: ToolContract, openapi: dict[str, Any], listed: dict[str, types.Tool]) -> None:
    tool = contract.name
    method, path = ROUTES[tool]
    operation = openapi["paths"][path][method]
    published = listed[tool]

    # MCP publishes the input model's schema, whole and without references …
    assert published.input_schema == inline(contract.input.model_json_schema())
    fields = published.input_schema["properties"]
    carried: set[str] = set()
    for also_method, also_path in [(method, path), *ALSO_ROUTES.get(tool, [])]:
        carried |= _carried(tool, openapi["paths"][also_path][also_method], fields)
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


def test_both_doors_take_disk_gib_in_its_range_and_show_it_and_the_start(
        deps: Deps, tmp_path: Path) -> None:
    """rift_vm_new's `disk_gib` (1 to 1024) at the MCP door and the REST door alike: out of
    range or not an integer is `invalid_argument` naming it; in range it is kept and
    shown, with how the VM started; a VM that names no image gets RIFT_DEFAULT_IMAGE."""
    from starlette.testclient import TestClient

    from rift.services.access import accounts

    accounts.add_user(deps, "ada", "correct horse battery")
    token = accounts.new_token(deps, "ada").token.value
    settings = Settings(data_dir=tmp_path, hypervisor_uri="fake:///local")
    with TestClient(create_app(settings, deps), base_url="http://127.0.0.1") as client:
        rest = {"Authorization": f"Bearer {token}"}
        made = client.post("/api/v1/tasks", headers=rest, json={}).json()
        task_id, handle = made["task"]["id"], made["handle"]
        vms = f"/api/v1/tasks/{task_id}/vms"
        for bad in (0, 1025, 2.5, "big"):
            answer = client.post(vms, headers=rest | {"Rift-Handle": handle},
                                 json={"disk_gib": bad})
            assert answer.status_code == 422, (bad, answer.text)
            error = answer.json()["error"]
            assert (error["code"], error["field"]) == ("invalid_argument", "disk_gib"), bad
            result = call_tool(client, token, "rift_vm_new", {"handle": handle, "disk_gib": bad})
            assert result["isError"] is True
            error = result["structuredContent"]["error"]
            assert (error["code"], error["field"]) == ("invalid_argument", "disk_gib"), bad
        by_rest = client.post(vms, headers=rest | {"Rift-Handle": handle},
                              json={"disk_gib": 1024}).json()["vm"]
        by_mcp = call_tool(client, token, "rift_vm_new",
                           {"handle": handle, "disk_gib": 1})["structuredContent"]["vm"]
        plain = call_tool(client, token, "rift_vm_new", {"handle": handle})
    for vm, disk in ((by_rest, 1024), (by_mcp, 1), (plain["structuredContent"]["vm"], 10)):
        assert (vm["status"], vm["image"], vm["memory_mib"], vm["disk_gib"]) == \
            ("running", "debian", 512, disk)
        assert vm["start"]["kind"] == "boot" and vm["start"]["ms"] >= 0
