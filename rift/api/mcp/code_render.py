"""The MCP door's renderings of code contexts (SPEC §20): a run's text (its results'
text forms, streams and error, for a model that reads text) and its charts as MCP
image content (a PNG, or an SVG, for a model that sees images)."""

from __future__ import annotations

import base64
import json
from typing import Any

import mcp_types as types


def context_line(x: dict[str, Any]) -> str:
    state = (f"running {x['running']}" if x["running"] else "idle") if x["alive"] \
        else "no kernel (one starts on its next run)"
    last = f", last run {x['last_run_at']}" if x["last_run_at"] else ""
    kernel = x["backend"] or "no kernel yet"
    where = f", in {json.dumps(x['cwd'])}" if x["cwd"] else ""
    return f"context {x['id']} on {x['vm_id']}: {x['language']} ({kernel}), {state}{last}{where}"


_TEXT_FORMS = ("text/plain", "text/markdown", "application/json", "text/html")


def run_code(out: dict[str, Any]) -> str:
    x = out["execution"]
    head = (f"run {x['run_id']} in context {x['context_id']}: {x['status'].replace('_', ' ')}"
            f" after {x['duration_ms']} ms (execution count {x['execution_count']})")
    if x["status"] == "running":
        head += (f"\nstill running: rift_vm_run_code_get with run_id={x['run_id']} wait_s=30 "
                 "reads it on")
    parts = [head]
    for n, result in enumerate(x["results"], 1):
        kind = "result" if result["is_main_result"] else "display"
        forms = ", ".join(result["data"])
        shown = next((m for m in _TEXT_FORMS if m in result["data"]), None)
        text = result["data"][shown] if shown else ""
        parts.append(f"--- {kind} {n} ({forms}) ---\n"
                     + (text if isinstance(text, str) else json.dumps(text)))
    for gone in x["omitted"]:
        parts.append(f"(left out: {gone['mime']} of {gone['bytes']} bytes: {gone['reason']})")
    if x["truncated"]:
        parts.append("(output was cut at 1 MiB)")
    parts.append(f"--- stdout ---\n{x['stdout']}\n--- stderr ---\n{x['stderr']}")
    if x["error"]:
        e = x["error"]
        parts.append(f"--- error: {e['name']}: {e['value']} ---\n{e['traceback']}")
    return "\n".join(parts)


def charts(out: dict[str, Any]) -> list[types.ContentBlock]:
    """A run's PNG and SVG results as MCP images, so a model sees its charts."""
    images: list[types.ContentBlock] = []
    for result in out["execution"]["results"]:
        data = result["data"]
        if isinstance(data.get("image/png"), str):
            images.append(types.ImageContent(type="image", data=data["image/png"],
                                             mime_type="image/png"))
        elif isinstance(data.get("image/svg+xml"), str):
            svg = base64.b64encode(data["image/svg+xml"].encode()).decode("ascii")
            images.append(types.ImageContent(type="image", data=svg,
                                             mime_type="image/svg+xml"))
    return images
