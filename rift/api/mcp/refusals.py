"""**Refusals** (`Refusals`, an `Extension.intercept_tool_call`): a `RiftError`
from a tool is a tool result with `isError`, the text `<code>: <message>` and a
`hint:` line, and `structuredContent.error` (SPEC §3), not a JSON-RPC error: a
model reads tool results, and the hint names the tool that mends it. Anything
else is the one `internal` refusal, logged, with no detail that could carry a
secret. Every call is counted in `rift_tool_calls_total`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension
from mcp.shared.exceptions import MCPError

from rift.api.metrics import Metrics
from rift.domain.errors import RiftError

log = logging.getLogger("rift.api.mcp")


INTERNAL = {"code": "internal", "message": "Rift failed unexpectedly; the error is logged",
            "hint": "call again; if it keeps failing, tell the operator (rift doctor)"}


def result(text: str, structured: dict[str, Any], is_error: bool,
           extra: Sequence[types.ContentBlock] = ()) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text), *extra],
                                structured_content=structured, is_error=is_error)


def refusal(error: dict[str, Any]) -> types.CallToolResult:
    return result(f"{error['code']}: {error['message']}\nhint: {error['hint']}",
                  {"error": error}, True)


_NO_STRUCTURED_CONTENT = ("2024-11-05", "2025-03-26")  # eras that read text only


def success(text: str, out: dict[str, Any], protocol_version: str,
            extra: Sequence[types.ContentBlock] = ()) -> types.CallToolResult:
    """A tool's answer: its text rendering and its output as structured content
    (also as JSON text for the eras that read text only), then `extra` content (a
    run's charts as images, for a model to see)."""
    if protocol_version in _NO_STRUCTURED_CONTENT:
        text += "\n" + json.dumps(out, ensure_ascii=False, separators=(",", ":"))
    return result(text, out, False, extra)


class Refusals(Extension):
    """Rift's refusals as tool results (see the module's docstring, 1). Not
    advertised to clients: it changes no wire shape, only what a tool answers."""

    identifier = "dev.rift/refusals"

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def intercept_tool_call(self, params: types.CallToolRequestParams,
                                  ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        try:
            answer = await call_next(ctx)
        except MCPError:  # a protocol fault (an unknown tool) stays a JSON-RPC error
            raise
        except RiftError as exc:
            self.metrics.record("mcp", params.name, exc.code)
            log.info("refused", extra={"door": "mcp", "tool": params.name, "code": exc.code})
            return refusal(exc.to_dict())
        except Exception:
            self.metrics.record("mcp", params.name, "internal")
            log.exception("tool call failed", extra={"door": "mcp", "tool": params.name})
            return refusal(dict(INTERNAL))
        self.metrics.record("mcp", params.name, "ok")
        return answer


